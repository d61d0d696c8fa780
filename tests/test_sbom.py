"""The committed bills of materials (sbom/, made by `make sbom` with cyclonedx-bom) are valid
CycloneDX, name this release, and list every runtime dependency of pyproject.toml at a version
its requirement allows (so a dependency added or bumped without `make sbom` fails here)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packaging.requirements import Requirement

from bridge import __version__

ROOT = Path(__file__).resolve().parent.parent
SBOMS = {
    "wheel": ROOT / "sbom" / "maintenance-bridge-wheel.cdx.json",
    "container": ROOT / "sbom" / "container-venv.cdx.json",
}
RUNTIME = [
    Requirement(text)
    for text in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
]


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.parametrize("which", SBOMS)
def test_the_sbom_is_valid_cyclonedx_of_this_release(which: str) -> None:
    text = SBOMS[which].read_text()
    bom: dict[str, Any] = json.loads(text)
    version = SchemaVersion.from_version(bom["specVersion"])
    assert JsonStrictValidator(version).validate_str(text) is None
    root = bom["metadata"]["component"]
    assert (root["name"], root["version"]) == ("maintenance-bridge", __version__)


@pytest.mark.parametrize("which", SBOMS)
def test_the_sbom_lists_every_runtime_dependency_at_an_allowed_version(which: str) -> None:
    bom = json.loads(SBOMS[which].read_text())
    found = {normalized(c["name"]): c for c in bom["components"]}
    root_ref = bom["metadata"]["component"]["bom-ref"]
    (root_deps,) = [d["dependsOn"] for d in bom["dependencies"] if d["ref"] == root_ref]
    for requirement in RUNTIME:
        component = found.get(normalized(requirement.name))
        assert component is not None, f"{requirement.name} is not in {SBOMS[which].name}"
        assert requirement.specifier.contains(component["version"]), (requirement, component)
        assert component["purl"].startswith(f"pkg:pypi/{normalized(requirement.name)}@")
        assert component["bom-ref"] in root_deps


def test_the_container_sbom_holds_what_the_image_s_environment_holds() -> None:
    """The image's virtual environment is made with `python -m venv`: pip is in it (and is
    audited with it); the wheel's bill lists the package's dependencies only."""
    names = {
        kind: {normalized(c["name"]) for c in json.loads(path.read_text())["components"]}
        for kind, path in SBOMS.items()
    }
    assert "pip" in names["container"]
    assert "pip" not in names["wheel"]
    assert names["wheel"] <= names["container"]
