"""The retention benchmark still runs end to end at a smoke size on SQLite and, when its
binaries are here, a real PostgreSQL (tests/fleet/postgres_server.py): the backlog pruned by
one pass while ingest and reads go on (not a timed test: it never checks the latencies)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.fleet_retention import main
from tests.fleet.postgres_server import find_bindir

pytestmark = pytest.mark.slow


def test_the_smoke_size_prunes_the_backlog_while_ingest_and_reads_go_on(tmp_path: Path) -> None:
    assert main(["--smoke", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "fleet-retention.md").read_text()
    stores = ["SQLite"] + (["PostgreSQL"] if find_bindir() is not None else [])
    for store in stores:
        section = report.split(f"## {store}\n")[1].split("\n## ")[0]
        assert "| ingest, a batch of 10 committed |" in section
        assert "| reads |" in section
        assert "retired 290 instances" in section  # the whole backlog's fleet
    assert "month partition" in report
