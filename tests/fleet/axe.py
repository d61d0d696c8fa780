"""axe-core, the accessibility checker the project's reviewers run on the fleet page.

axe-core is a JavaScript library (npm); the test injects its `axe.min.js` into the page in
Chromium (tests/fleet/chromium.py) and runs `axe.run()` there. The set-up installs it with
`npm install --prefix .venv/axe-core axe-core@4` when it is missing (git-ignored with the
venv, so one download per checkout), and npm itself from Debian's package when that is
missing and it runs as root (`tests.debian_tool`); otherwise, or when the install fails, the
tests are skipped on a laptop and fail under `CI=true`, like the other real parts
(tests/fleet/chromium.py, tests/etcd_server.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Final

import pytest

from tests.debian_tool import debian_tool

#: Where the set-up installs axe-core: beside the project's virtualenv, ignored by git.
PREFIX: Final = Path(__file__).resolve().parents[2] / ".venv" / "axe-core"
AXE: Final = PREFIX / "node_modules" / "axe-core" / "axe.min.js"
PACKAGE: Final = "axe-core@4"
INSTALL_HELP: Final = (
    "The fleet page's accessibility test needs axe-core: install Node.js's npm "
    f"(`apt-get install npm`); the test then runs `npm install --prefix {PREFIX} {PACKAGE}`."
)
#: The impacts that fail the check; "minor" and "moderate" are reported, not failed.
FAILING: Final = ("serious", "critical")


def _install(npm: str) -> None:
    """npm install axe-core into PREFIX; quiet on failure (the caller skips or fails with
    INSTALL_HELP)."""
    PREFIX.mkdir(parents=True, exist_ok=True)
    command = [npm, "install", "--prefix", str(PREFIX), "--no-audit", "--no-fund", PACKAGE]
    try:
        subprocess.run(command, capture_output=True, timeout=300, check=True)
    except (OSError, subprocess.SubprocessError):
        return


def axe_or_skip() -> Path:
    """axe.min.js, installed with npm when missing (npm itself from Debian's package when
    missing and we are root: `tests.debian_tool`)."""
    if not AXE.exists():
        _install(debian_tool("npm", "npm"))
    if not AXE.exists():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(INSTALL_HELP)
        pytest.skip(INSTALL_HELP)
    return AXE


def described(violation: dict[str, Any]) -> str:
    """A violation as a reviewer fixes it: its rule, impact, help (with the link) and the
    selector of every offending element."""
    targets = [" ".join(map(str, node["target"])) for node in violation["nodes"]]
    return (
        f"{violation['id']} ({violation.get('impact')}): {violation['help']} "
        f"[{violation['helpUrl']}] at {targets}"
    )


def failing(violations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Those of `axe.run()`'s violations whose impact fails the check."""
    return [v for v in violations if v.get("impact") in FAILING]
