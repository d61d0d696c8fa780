"""The README's screenshot script runs the real fleet demo and photographs its page in
Chromium (quick speed; it checks the pictures are made from the demo's fleet, not how they
look: docs/img/ holds the committed ones)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from bench.screenshot import main
from tests.fleet.chromium import chromium_or_skip

pytestmark = pytest.mark.slow


def test_the_screenshots_are_made_from_the_fleet_demo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chromium_or_skip()
    assert main(["--out", str(tmp_path), "--speed", "10"]) == 0
    said = capsys.readouterr().err
    assert "the page shows 5 instances reporting" in said  # the demo's five VMs
    laptop = size(tmp_path / "dashboard.png")
    assert laptop[0] == 1280
    assert laptop[1] > 800  # the whole page
    assert size(tmp_path / "dashboard-phone.png")[0] == 390


def size(png: Path) -> tuple[int, int]:
    """Width and height from a PNG's header (its IHDR chunk)."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height
