"""The floors of the code (docs/architecture.md, "The floors"), checked two ways.

The rule is the import-linter contracts in pyproject.toml (`[tool.importlinter]`): here
`lint-imports` runs on the sources, so `pytest` and `make lint` give the same answer, and a
copy of the sources with a few forbidden imports shows that the contracts see every kind of
import (inside a function, relative, under `TYPE_CHECKING`). The picture in the doc is drawn
from the same contracts (tools/floors.py) and must equal what the script draws.

What import-linter cannot say is checked here in its own words: every module of `bridge/`
stands on a floor; `importlib` loads modules only in the registries and in the few places
named below with their reasons; a subpackage's `__init__.py` imports only its own modules.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sysconfig
import tomllib
from pathlib import Path
from typing import Any, Final

from tools import floors

ROOT: Final = Path(__file__).resolve().parent.parent
PYPROJECT: Final = ROOT / "pyproject.toml"
DOC: Final = ROOT / "docs" / "architecture.md"

#: The modules that load others by name with `importlib` outside the registries, and why.
#: None of them crosses a floor: each loads a module of its own package, or generated data.
DYNAMIC_LOADS: Final = {
    # PEP 562: its names on first use, so `run` (whose parser has the `simulate` options)
    # does not pay for aiohttp at start-up.
    "bridge/simulator/__init__.py": "the simulator's own modules, on first use",
    # A part (loaded through the provider registry) serves with the `http` module beside it.
    "bridge/simulator/part.py": "a simulated provider's `http` module, beside its part",
    # Written into a built package only (setup.py); a checkout asks git instead.
    "bridge/infra/buildinfo.py": "`bridge._build`, the build stamp",
    # The PostgreSQL driver is an extra: the store module is loaded when a URL asks for it.
    "bridge/fleet/service.py": "the fleet's own `postgres_store`",
}


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the sources under `root` (with its pyproject.toml)."""
    command = [str(Path(sysconfig.get_path("scripts")) / "lint-imports"), "--no-cache"]
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        command, cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_the_code_keeps_the_contracts() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_contracts_see_imports_in_functions_relative_and_for_type_checking(
    tmp_path: Path,
) -> None:
    """A copy of the sources where the pipeline (floor 6) reaches up to the runner inside a
    function, to the surface relatively under `TYPE_CHECKING`, and across to a sink."""
    for top in ("bridge", "sinks"):
        shutil.copytree(ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PYPROJECT, tmp_path / "pyproject.toml")
    model = tmp_path / "bridge" / "pipeline" / "model.py"
    added = [
        "from typing import TYPE_CHECKING",
        "def _later() -> None:",
        "    from bridge.runner import Bridge",
        "if TYPE_CHECKING:",
        "    from ..surface import metrics",
        "import sinks.stdout",
    ]
    source = model.read_text(encoding="utf-8") + "\n" + "\n".join(added) + "\n"
    model.write_text(source, encoding="utf-8")
    line = {text.strip(): n for n, text in enumerate(source.splitlines(), start=1)}
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    for imported, statement in [
        ("bridge.runner", "from bridge.runner import Bridge"),
        ("bridge.surface.metrics", "from ..surface import metrics"),
        ("sinks.stdout", "import sinks.stdout"),
    ]:
        assert f"bridge.pipeline.model -> {imported} (l.{line[statement]})" in result.stdout


def test_the_doc_draws_the_floors_of_the_contracts() -> None:
    """Redraw with `python tools/floors.py --write` after changing the contracts."""
    assert floors.block_in(DOC.read_text(encoding="utf-8")) == floors.render(PYPROJECT)


def _contracts() -> list[dict[str, Any]]:
    with PYPROJECT.open("rb") as file:
        found: list[dict[str, Any]] = tomllib.load(file)["tool"]["importlinter"]["contracts"]
    return found


def test_at_most_three_exceptions_each_with_its_reason_here_and_in_the_doc() -> None:
    exceptions = [rule for c in _contracts() for rule in c.get("ignore_imports", [])]
    assert len(exceptions) <= 3, exceptions
    toml_lines = PYPROJECT.read_text(encoding="utf-8").splitlines()
    doc = DOC.read_text(encoding="utf-8")
    for rule in exceptions:
        at = next(n for n, line in enumerate(toml_lines) if line.strip() == f'"{rule}",')
        assert toml_lines[at - 1].strip().startswith("#"), f"{rule}: no reason in pyproject"
        named = rule.removesuffix(".**")
        assert re.search(rf"^- `{re.escape(named)}`: \S", doc, re.MULTILINE), (
            f"{rule}: not named with its reason in docs/architecture.md"
        )


def test_every_module_of_bridge_stands_on_a_floor() -> None:
    """The layers contract lists modules, not a container: a new top-level module would be
    outside every rule unless it is given a floor."""
    on_floors = {name for names, _ in floors.floors(PYPROJECT) for name in names}
    top_level = {
        f"bridge.{path.stem if path.is_file() else path.name}"
        for path in (ROOT / "bridge").iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").exists()
    }
    # bridge/_build.py: the build stamp written into a built package (data, no imports).
    assert top_level - {"bridge._build"} <= on_floors, top_level - on_floors
    assert "sinks" in on_floors


def _sources() -> list[Path]:
    return [path for top in ("bridge", "sinks") for path in sorted((ROOT / top).rglob("*.py"))]


def _loads_by_name(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            called = node.func
            name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
            if name in ("import_module", "__import__"):
                return True
    return False


def test_importlib_loads_only_in_the_registries_and_the_named_places() -> None:
    """A module loaded by name is an import no contract sees: the registries (modules named
    for it, `*registry.py`) are where plug-ins are loaded, and the few other places load
    a module of their own package."""
    loading = {
        str(path.relative_to(ROOT))
        for path in _sources()
        if _loads_by_name(ast.parse(path.read_text(encoding="utf-8")))
    }
    registries = {path for path in loading if path.endswith("registry.py")}
    assert registries, "the registries load plug-ins by name"
    assert loading - registries == set(DYNAMIC_LOADS)


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")[: -node.level]
    return ".".join([*base, *([node.module] if node.module else [])])


def test_a_subpackage_init_imports_only_its_own_modules() -> None:
    """Importing one module never imports a sibling package: `run` loads only what it uses
    (`python -X importtime -m bridge run ...`), and a sink's or coordination engine's SDK
    only when configured. The root packages' own `__init__` import nothing of the product."""
    found = []
    for path in _sources():
        if path.name != "__init__.py":
            continue
        package = ".".join(path.relative_to(ROOT).parent.parts)
        # A root package's own `__init__` (the version) is imported by every floor, even
        # `bridge.infra`: it imports nothing of the product.
        own = package if "." in package else f"{package}.__nothing__"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                targets = [_absolute(f"{package}.__init__", node)]
            else:
                continue
            found += [
                f"{package}: {target}"
                for target in targets
                if target.split(".")[0] in ("bridge", "sinks")
                and not (target == own or target.startswith(f"{own}."))
            ]
    assert found == []


def test_the_contract_reads_events_without_the_sidecars_dependencies() -> None:
    """A consumer imports `bridge.contract` to read our events: no HTTP client, no retry
    library, no other bridge module."""
    tree = ast.parse((ROOT / "bridge" / "contract.py").read_text(encoding="utf-8"))
    imported = {
        name
        for node in ast.walk(tree)
        for name in (
            [alias.name for alias in node.names]
            if isinstance(node, ast.Import)
            else [_absolute("bridge.contract", node)]
            if isinstance(node, ast.ImportFrom)
            else []
        )
    }
    assert not {name.split(".")[0] for name in imported} & {"aiohttp", "h11", "tenacity", "sinks"}
    assert not [name for name in imported if name.startswith("bridge")]


def test_the_provider_registry_lists_the_contracts_providers() -> None:
    """One source of truth: the registry's names are the contract's `ProviderName`, and every
    registered provider loads and says its own name."""
    from bridge.providerapi import registry
    from bridge.providers import plugins

    registry._check()
    assert [plugins.get(name).name for name in registry.names()] == list(registry.names())


def test_the_schema_version_names_the_schema_and_ends_its_uri() -> None:
    from bridge import contract
    from bridge.pipeline import events

    assert contract.SCHEMA_URI.endswith(f"/v{contract.SCHEMA_VERSION}.json")
    assert f"maintenance-event.v{contract.SCHEMA_VERSION}.json" == events.SCHEMA_FILE
    assert events.schema()["$id"] == contract.SCHEMA_URI
