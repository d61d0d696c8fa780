"""`bench.fleet_writes` (the store's CPU per event written) runs end to end at a small
size: a figure per shape and kind, each from a pre-filled SQLite store."""

from __future__ import annotations

from bench import fleet_writes


async def test_the_write_cost_bench_gives_every_figure() -> None:
    figures = await fleet_writes.run(instances=60, events=400, count=300, kinds=["sqlite"])
    assert [(f.shape, f.kind) for f in figures] == [
        (shape, kind) for shape in fleet_writes.SHAPES for kind in fleet_writes.KINDS
    ]
    for figure in figures:
        assert (figure.store, figure.events, figure.server_us) == ("SQLite", 300, None)
        assert figure.fleet_us >= 0
        assert figure.row().startswith("| SQLite |")
