"""Debian's Chromium, driven by Playwright for Python, for the dashboard's browser tests.

Playwright is pointed at the machine's `/usr/bin/chromium` (`executable_path`): its own
browser download (`playwright install`) is never used, so the tests run on an air-gapped
machine. The set-up installs the Debian package when it is missing and we are root; without
it the tests are skipped on a laptop and fail under `CI=true`, like the other real parts
(`tests/sinks/pubsub_emulator.py`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import pytest
from playwright.async_api import BrowserContext, async_playwright

from tests.support import running_as_root

CHROMIUM: Final = Path("/usr/bin/chromium")
#: Headless, and nothing that reaches out: the machine has no network beyond loopback.
ARGS: Final = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
INSTALL_HELP: Final = (
    "The dashboard's browser tests need Chromium at /usr/bin/chromium: "
    "`apt-get install chromium` (Debian/Ubuntu). Playwright's own browser download is not used."
)
#: Where the tests write their screenshots (git-ignored).
ARTIFACTS: Final = Path(__file__).resolve().parents[1] / "artifacts" / "dashboard"


def _install() -> None:
    """apt-get install chromium, when we may (root, apt-get present); quiet on failure."""
    if not running_as_root() or shutil.which("apt-get") is None:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
        try:
            subprocess.run(command, env=env, capture_output=True, timeout=900, check=True)
        except (OSError, subprocess.SubprocessError):
            return


def chromium_or_skip() -> Path:
    if not CHROMIUM.exists():
        _install()
    if not CHROMIUM.exists():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(INSTALL_HELP)
        pytest.skip(INSTALL_HELP)
    return CHROMIUM


@asynccontextmanager
async def chromium(profile: Path) -> AsyncIterator[BrowserContext]:
    """Debian's Chromium, headless, with the fresh profile `profile`, at a laptop's size
    (the tests and `bench.dashboard`)."""
    async with async_playwright() as driver:
        context = await driver.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=ARGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            yield context
        finally:
            await context.close()


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[BrowserContext]:
    chromium_or_skip()
    async with chromium(tmp_path / "chromium-profile") as context:
        yield context
