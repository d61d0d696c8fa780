"""The store's own cost of writing events: CPU microseconds per event, per store and shape.

`python -m bench.fleet_writes` pre-fills a store of each kind (`bench.fleet_prefill`: by
default 100,000 instances and 300,000 events of `bench.fleet_workload`), then writes fresh
events into it through `Store.ingest_many`, and reports the CPU that cost per event: the
fleet process's (SQLite writes in it) and, for PostgreSQL, its server processes'. Wall-clock
rates swing with whatever else runs on the machine; CPU per event is what a change to the
writer moves, so this is the figure to compare before and after one.

The events are decoded before the clock starts (that is the checking side's cost, not the
store's), in the shapes ingest produces:

- `batch`: batches of 100 (`BATCH`), one transaction each, as the HTTP batch path and the
  webhook sink make them;
- `group`: one-event batches, `GROUP` per transaction, as group commit hands over many
  one-event posts;

each for `heartbeats` (new heartbeats round the fleet, VM after VM in the fleet's order),
`heartbeats-due` (new heartbeats in the order they fall due: the VMs whose last heartbeat
is the oldest first, so a transaction holds VMs from all over the fleet that heartbeated
together 300 s before, as a real fleet's do) and `transitions` (a region's maintenance: a
notice scheduled, then started, per VM). The two heartbeat orders load the indexes
differently: in the fleet's order a transaction's VMs are neighbours in every index keyed
by name or source (a few pages for a hundred rows) and spread over the index of when each
turns silent (their last heartbeats were a second apart each); due, it is the reverse.

After each SQLite figure, a `SQLite floor` row: what the engine alone costs. Fresh events
of the same shape and kind are composed by the fleet's writer (`bridge.fleet.writes`)
into their statements and rows without running the writes (its reads run: they are part
of the work; every insert counts as new, as it is for fresh events), untimed; then plain
sqlite3, on a connection of its own to the same file with the store's settings, runs
those statements with those rows, transaction by transaction with the same commits, timed.
No fleet code runs in that time, so the floor is SQLite's own CPU per event for the
schema, indexes and triggers as they are, and `1e6 / floor` events/s is the ceiling one
writer thread (the store has one: SQLite writes one transaction at a time) reaches
however fast the fleet's Python around it, whatever the number of cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sqlite3
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import psutil

from bench.fleet_ingest import cpu_seconds
from bench.fleet_prefill import prefill
from bench.fleet_workload import Workload
from bridge import contract
from bridge.fleet import writes
from bridge.fleet.service import build_store
from bridge.fleet.store import Accepted, Batch

#: The name of the plain sqlite3 rows (`compose`, `replay`).
FLOOR: Final = "SQLite floor"
BATCH: Final = 100
GROUP: Final = 200
SHAPES: Final = ("batch", "group")
KINDS: Final = ("heartbeats", "heartbeats-due", "transitions")


@dataclass(frozen=True)
class Figure:
    store: str
    shape: str
    kind: str
    events: int
    fleet_us: float
    server_us: float | None

    def row(self) -> str:
        server = "" if self.server_us is None else f"{self.server_us:.1f}"
        total = self.fleet_us + (self.server_us or 0.0)
        return (
            f"| {self.store} | {self.shape} | {self.kind} | {self.events:,} | "
            f"{self.fleet_us:.1f} | {server} | {total:.1f} |"
        )


def _accepted(bodies: Sequence[bytes]) -> list[Accepted]:
    return [Accepted(contract.from_cloudevent(body), body) for body in bodies]


def _transactions(items: list[Accepted], shape: str) -> list[list[Batch]]:
    """`items` as the store calls of `shape`: each a list of batches in one transaction."""
    now = time.time()
    if shape == "batch":
        return [
            [Batch(ingest="http", received_at=now, accepted=items[at : at + BATCH])]
            for at in range(0, len(items), BATCH)
        ]
    ones = [Batch(ingest="http", received_at=now, accepted=[item]) for item in items]
    return [ones[at : at + GROUP] for at in range(0, len(ones), GROUP)]


#: One call of a composed transaction: statement, parameters (rows for `executemany`), many.
Call = tuple[str, Any, bool]


class _NewRow:
    """What a write the recorder did not run answers: one row written (fresh events)."""

    rowcount: Final = 1

    def fetchall(self) -> list[Any]:
        return []


class _Recorder:
    """Stands in for the store's connection while `writes.apply_many` composes a
    transaction: a read runs on `db` (the writer uses its rows) and is kept, to be run
    again in the floor's time; a write is only kept."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.calls: list[Call] = []

    def execute(self, statement: str, params: Sequence[Any] = ()) -> Any:
        self.calls.append((statement, params, False))
        if statement.lstrip().upper().startswith("SELECT"):
            return self.db.execute(statement, params)
        return _NewRow()

    def executemany(self, statement: str, rows: Any) -> None:
        self.calls.append((statement, list(rows), True))


def compose(db: sqlite3.Connection, calls: list[list[Batch]]) -> list[list[Call]]:
    """Each transaction of `calls` as the statements and rows the fleet's writer runs for
    it, reading `db` where the writer reads. Exact for fresh events, as long as no VM
    sends two heartbeats in `calls` (a later transaction's reads would see the state before
    the earlier one's writes): true of `Workload.heartbeats(count <= instances)`."""
    composed = []
    for batches in calls:
        recorder = _Recorder(db)
        writes.apply_many(recorder, batches)
        composed.append(recorder.calls)
    return composed


def replay(db: sqlite3.Connection, transactions: list[list[Call]]) -> None:
    """Run `transactions` with plain sqlite3, each in its own write transaction."""
    for calls in transactions:
        db.execute("BEGIN IMMEDIATE")
        for statement, params, many in calls:
            if many:
                db.executemany(statement, params)
            else:
                db.execute(statement, params).fetchall()
        db.execute("COMMIT")


def _floor_connection(path: str) -> sqlite3.Connection:
    """A plain connection with the store's settings (`bridge.fleet.sqlite_store`)."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA busy_timeout=10000")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return db


def server_cpu(pid: int) -> float:
    """CPU seconds of the PostgreSQL server `pid` and all its processes, those that ended
    too (their times are added to the postmaster's when it reaps them): the backends,
    the autovacuum workers and the writers come and go."""
    server = psutil.Process(pid)
    times = server.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in server.children():
        with contextlib.suppress(psutil.Error):  # ended meanwhile: counted by the postmaster
            times = child.cpu_times()
            total += times.user + times.system
    return total


def _server_pid(directory: Path) -> int:
    return int((directory / "data" / "postmaster.pid").read_text().split()[0])


@contextlib.asynccontextmanager
async def _postgres() -> AsyncIterator[tuple[str, int] | None]:
    """A throw-away PostgreSQL cluster (tests/fleet/postgres_server.py's), or None."""
    import shutil

    from tests.fleet.postgres_server import PostgresServer, find_bindir
    from tests.support import free_port, running_as_root

    bindir = find_bindir()
    if bindir is None:
        yield None
        return
    directory = Path(tempfile.mkdtemp(prefix="bench-writes-pg-"))
    if running_as_root():
        shutil.chown(directory, "nobody")
    server = PostgresServer(bindir, directory, free_port())
    await asyncio.to_thread(server.start)
    try:
        yield server.create_database(), _server_pid(directory)
    finally:
        await asyncio.to_thread(server.stop)
        shutil.rmtree(directory, ignore_errors=True)


async def _settle(url: str) -> None:
    """Before each figure: PostgreSQL vacuumed, analyzed and checkpointed, so that what the
    autovacuum, the statistics and the checkpointer owe for earlier writes (the pre-fill's
    above all) is not counted in this figure (what they do for its own writes is); SQLite's
    write-ahead log checkpointed into the file."""
    if url.startswith("sqlite://"):
        import sqlite3

        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite://"))) as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return
    import psycopg

    def settle() -> None:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute("VACUUM ANALYZE")
            connection.execute("CHECKPOINT")

    await asyncio.to_thread(settle)


async def measure(
    name: str, url: str, server: int | None, workload: Workload, count: int
) -> list[Figure]:
    """Pre-fill the store at `url`, then each shape and kind of `count` fresh events."""
    await prefill([url], workload.history())
    store = build_store(url)
    await store.open()
    figures = []
    sqlite = url.removeprefix("sqlite://") if url.startswith("sqlite://") else None
    floor_db = _floor_connection(sqlite) if sqlite else None
    sequence = 2_000_000

    def fresh(shape: str, kind: str) -> list[list[Batch]]:
        nonlocal sequence
        if kind == "heartbeats":
            bodies = workload.heartbeats(count, first_sequence=sequence)
            sequence += -(-count // workload.instances) + 1
        elif kind == "heartbeats-due":
            bodies = workload.due_heartbeats(count, first_sequence=sequence)
            sequence += -(-count // workload.instances) + 1
        else:
            bodies = workload.burst(count, tag=f"{shape}-{time.time_ns()}")
        return _transactions(_accepted(bodies), shape)

    try:
        for shape in SHAPES:
            for kind in KINDS:
                calls = fresh(shape, kind)
                await _settle(url)
                cpu, server_at = cpu_seconds(), server_cpu(server) if server else 0.0
                for batches in calls:
                    await store.ingest_many(batches)
                fleet = (cpu_seconds() - cpu) / count * 1e6
                pg = (server_cpu(server) - server_at) / count * 1e6 if server else None
                figures.append(Figure(name, shape, kind, count, fleet, pg))
                print(figures[-1].row(), flush=True)
                if floor_db is not None:
                    composed = compose(floor_db, fresh(shape, kind))
                    await _settle(url)
                    cpu = cpu_seconds()
                    replay(floor_db, composed)
                    floor = (cpu_seconds() - cpu) / count * 1e6
                    figures.append(Figure(FLOOR, shape, kind, count, floor, None))
                    print(figures[-1].row(), flush=True)
    finally:
        if floor_db is not None:
            floor_db.close()
        await store.close()
    return figures


async def run(instances: int, events: int, count: int, kinds: Sequence[str]) -> list[Figure]:
    workload = Workload(instances, events)
    figures: list[Figure] = []
    print(
        "| store | shape | kind | n | fleet CPU us/event | PostgreSQL CPU us/event | all |\n"
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
        flush=True,
    )
    if "sqlite" in kinds:
        with tempfile.TemporaryDirectory(prefix="bench-writes-") as tmp:
            url = f"sqlite://{Path(tmp) / 'fleet.sqlite3'}"
            figures += await measure("SQLite", url, None, workload, count)
    if "postgresql" in kinds:
        async with _postgres() as found:
            if found is None:
                print("PostgreSQL: skipped, no server binaries")
            else:
                figures += await measure("PostgreSQL", found[0], found[1], workload, count)
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_writes", description=__doc__)
    parser.add_argument("--instances", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=300_000, help="the pre-fill")
    parser.add_argument("--count", type=int, default=20_000, help="events per figure")
    parser.add_argument("--stores", default="sqlite,postgresql")
    args = parser.parse_args(argv)
    asyncio.run(run(args.instances, args.events, args.count, args.stores.split(",")))


if __name__ == "__main__":
    main()
