"""The fleet benchmark still runs end to end on tiny sizes (not a timed test: it checks that
every figure was produced, never what it is)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.fleet import main

pytestmark = pytest.mark.slow


def test_the_quick_fleet_benchmark_writes_its_report(tmp_path: Path) -> None:
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "fleet.md").read_text()
    for line in (
        "## Targets",
        "HTTP batch ingest into SQLite",
        "| eligible, 3 candidates |",
        "ingest with identity required >= 90% of the rate with it off",
        "| required / off |",
    ):
        assert line in report
    assert "nan" not in report
