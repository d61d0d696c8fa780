"""The fleet-at-scale benchmark still runs end to end at a smoke size, SQLite and PostgreSQL
side by side (not a timed test: it checks that every figure was produced and the plot
written, never what the figures are)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.fleet_scale import main
from tests.fleet.postgres_server import find_bindir

pytestmark = pytest.mark.slow


def test_the_smoke_size_writes_every_figure_for_each_store(tmp_path: Path) -> None:
    assert main(["--smoke", "--instances", "120", "--events", "1200", "--out", str(tmp_path)]) == 0

    report = (tmp_path / "fleet-scale.md").read_text()
    assert "FAILED" not in report
    assert not re.search(r"\bnan\b", report)  # every figure measured something
    stores = ["SQLite"] + (["PostgreSQL"] if find_bindir() is not None else [])
    for store in stores:
        section = report.split(f"## {store}\n")[1].split("\n## ")[0]
        for figure in (
            "one-event signed posts, 64 senders",
            "HTTP batches of 100",
            "Event Hubs (test AMQP server)",
            "Kafka consumer group",  # the kafka extra is a dev dependency
            "| notices, all in force",
            "| instances, all",
            "| eligible, 3 candidates",
            "| page / (server render)",
            "fleet service RSS",
            "burst of 600 one-event posts",
            "burst: API during it",
        ):
            assert figure in section, (store, figure)
        # The batch figure says what an event cost and the ceiling that sets on this host.
        budget = re.search(r"CPU per event fleet \d+, senders \d+(, PostgreSQL \d+)? us", section)
        assert budget is not None, section
        assert (budget.group(1) is not None) == (store == "PostgreSQL")
    assert (tmp_path / "fleet-scale.png").read_bytes().startswith(b"\x89PNG")
