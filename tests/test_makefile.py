"""The README's two commands install what each needs: `make demo` the runtime only (the
package with the simulator, about 45 MB: it runs on a fresh clone in well under 2 minutes),
`make test` every extra and the development tools on top.

Real `make`, dry-run (`-n`) against a virtual environment that does not exist yet, so it
prints every step a fresh clone would take without running them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def steps(target: str, tmp_path: Path) -> list[str]:
    if shutil.which("make") is None:
        if CI:
            pytest.fail("make is not installed")
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"
    # Run under `make test` (as CI does), an inner make would inherit MAKELEVEL and print
    # "Entering directory" lines: a make of its own, as a person runs it.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", target, f"VENV={venv}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return [line.replace(str(venv), "VENV") for line in done.stdout.splitlines()]


def installs(lines: list[str]) -> list[str]:
    return [line.split(" install ", 1)[1] for line in lines if " -m pip install " in line]


def test_make_demo_installs_only_the_package_and_its_runtime(tmp_path: Path) -> None:
    lines = steps("demo", tmp_path)
    assert installs(lines) == ["--quiet -e ."]  # no extras, no dev tools, no pip upgrade
    assert lines[-1] == "VENV/bin/maintenance-bridge demo"


def test_make_demo_fleet_needs_no_more_than_the_demo(tmp_path: Path) -> None:
    assert installs(steps("demo-fleet", tmp_path)) == ["--quiet -e ."]


def test_make_test_installs_the_rest_on_top(tmp_path: Path) -> None:
    lines = steps("test", tmp_path)
    assert installs(lines) == [
        "--quiet -e .",
        "--quiet --upgrade pip",
        "--quiet -e '.[dev,pubsub,eventhubs,kafka,windows,postgres,otel]'",
        # checkov, in a virtual environment of its own (it pins older libraries)
        "--quiet checkov==3.3.30",
    ]
    assert "VENV/bin/pytest" in lines


def test_the_readme_keeps_its_two_commands() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "make demo" in readme
    assert "make test" in readme
