"""The replicas benchmark still runs end to end at a smoke size: two fleet processes on one
real PostgreSQL (tests/fleet/postgres_server.py), every phase measured and every event stored
once (not a timed test: it never checks what the figures are)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.fleet_replicas import main
from tests.fleet.postgres_server import INSTALL_HELP, _in_ci, find_bindir

pytestmark = pytest.mark.slow


def test_the_smoke_size_measures_every_phase_and_stores_each_event_once(tmp_path: Path) -> None:
    if find_bindir() is None:
        if _in_ci():
            pytest.fail(INSTALL_HELP)
        pytest.skip(INSTALL_HELP)
    assert main(["--smoke", "--instances", "100", "--events", "1000", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "fleet-replicas.md").read_text()
    for phase in ("| one-event signed posts", "| HTTP batches of 100", "| API reads"):
        assert phase in report
    assert "Every event stored once" in report
    assert ": yes." in report
    assert " nan " not in report
