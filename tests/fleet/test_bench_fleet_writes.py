"""`bench.fleet_writes` (the store's CPU per event written) runs end to end at a small
size: a figure per shape and kind, each from a pre-filled SQLite store, each followed by
plain sqlite3's floor for the same statements and commits."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from bench import fleet_writes
from bench.fleet_workload import Workload
from bridge.fleet.service import build_store


async def test_the_write_cost_bench_gives_every_figure_and_its_floor() -> None:
    figures = await fleet_writes.run(instances=60, events=400, count=300, kinds=["sqlite"])
    assert [(f.store, f.shape, f.kind) for f in figures] == [
        (store, shape, kind)
        for shape in fleet_writes.SHAPES
        for kind in fleet_writes.KINDS
        for store in ("SQLite", fleet_writes.FLOOR)
    ]
    for figure in figures:
        assert (figure.events, figure.server_us) == (300, None)
        assert figure.fleet_us >= 0
        assert figure.row().startswith(f"| {figure.store} |")


async def test_the_floor_writes_what_the_store_writes(tmp_path: Path) -> None:
    """The floor's statements, replayed by plain sqlite3, leave the rows and counts that
    the store's own ingest of the same events leaves."""
    workload = Workload(30, 100)
    bodies = workload.heartbeats(30) + workload.burst(40, tag="floor")
    tables = ("events", "instances", "notices", "tallies", "silent_tallies")
    calls = fleet_writes._transactions(fleet_writes._accepted(bodies), "batch")
    found = []
    for how in ("store", "floor"):
        path = tmp_path / f"{how}.sqlite3"
        store = build_store(f"sqlite://{path}")
        await store.open()
        if how == "store":
            for batches in calls:
                await store.ingest_many(batches)
            await store.close()
        else:
            await store.close()
            db = fleet_writes._floor_connection(str(path))
            fleet_writes.replay(db, fleet_writes.compose(db, calls))
            db.close()
        db = sqlite3.connect(path)
        found.append(
            {
                table: sorted(
                    db.execute(f"SELECT * FROM {table}").fetchall(),  # noqa: S608
                    key=repr,
                )
                for table in tables
            }
        )
        db.close()
    assert found[0]["events"]
    assert found[0]["notices"]
    for table in tables:
        assert found[0][table] == found[1][table], table
