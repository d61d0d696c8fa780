"""The fleet ingest benchmark still runs (tiny sizes). Not a timed test: it asserts that
every part produced a figure, never what the figures are."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.fleet_ingest import main

pytestmark = pytest.mark.slow


def test_the_quick_fleet_ingest_benchmark_writes_its_table(tmp_path: Path) -> None:
    out = tmp_path / "fleet-ingest.md"
    assert main(["--events", "200", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ")]
    measured = {tuple(cell.strip() for cell in row.split("|")[1:3]) for row in rows[2:]}
    assert ("HTTP batch (4 clients x 100)", "SQLite") in measured
    assert ("Kafka consumer group", "SQLite") in measured  # the kafka extra is a dev dependency
    assert all(row.split("|")[3].strip() == "200" for row in rows[2:])
