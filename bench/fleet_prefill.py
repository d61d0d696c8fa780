"""The fleet benchmarks' pre-fill: a large audit log into fresh stores, fast, with exactly
the rows ingest writes.

A million events through the stores' own `ingest` in batches of 500 took 12 minutes on
PostgreSQL (and 3 on SQLite) on 2 cores: most of a full `bench.fleet_scale` run, spent on
something that is not a figure. Side by side at 50,000 events this fill is 1.5 times as fast
on PostgreSQL and 1.1 times on SQLite: what remains is ingest's own per-event state
statements (the heartbeat update above all), which the fill keeps so its rows are ingest's.
The pre-fill keeps ingest's own writer for everything but the audit log's append, and makes
that append a bulk one:

- each chunk of `CHUNK` events is one `Batch` written by `bridge.fleet.writes.apply` in one
  store transaction (`Store.transaction`): the instance upserts, heartbeats, notices and the
  kept counts (`bridge.fleet.tallies`, its triggers and `bump`) are ingest's own statements,
  so the state and the tallies are what ingest would leave;
- only the writer's `insert_events` differs (`bridge.fleet.writes.Writer`, the hook each
  dialect already has): SQLite appends the chunk with one `executemany` of ingest's own
  `INSERT_EVENT`; PostgreSQL `COPY`s the keys into `event_keys` and the rows into the
  partitioned `events` (the server routes each row to its month), the columns
  `partitions.insert_events` writes.

The events of a pre-fill are new by construction (a fresh store, distinct ids): a key already
stored fails the pre-fill (SQLite: fewer rows changed than sent; PostgreSQL: `COPY` into the
primary key of `event_keys`), so nothing is silently doubled or dropped.
tests/fleet/test_bench_prefill.py checks that a pre-filled store reads the same as one
filled through `ingest`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

from bridge import contract
from bridge.fleet import partitions, sql
from bridge.fleet.retention import Prunable
from bridge.fleet.service import build_store
from bridge.fleet.store import Accepted, Batch, Store
from bridge.fleet.writes import EventRow, InstanceRow, RowWriter, Writer, apply

#: Events per transaction: large enough that the per-transaction cost vanishes, small enough
#: that a chunk's decoded events stay a few tens of MiB.
CHUNK: Final = 20_000


def _chunks(bodies: Iterable[bytes], size: int) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    for body in bodies:
        chunk.append(body)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class SqliteBulk(RowWriter):
    """Ingest's own statements, but the chunk's audit-log rows in one `executemany` of
    ingest's `INSERT_EVENT` (the events of a pre-fill are new by construction)."""

    def insert_events(self, db: Any, rows: list[EventRow]) -> set[tuple[str, str]]:
        before = db.total_changes
        db.executemany(sql.INSERT_EVENT, rows)
        if db.total_changes - before != len(rows):
            raise RuntimeError("pre-fill: the store already held some of these events")
        return {(row[0], row[1]) for row in rows}


class PostgresBulk:
    """The PostgreSQL store's own writer (`postgres_store.WRITER`), but the chunk into the
    partitioned audit log and its de-duplication keys by `COPY` (the columns
    `bridge.fleet.partitions.insert_events` writes)."""

    def __init__(self) -> None:
        from bridge.fleet.postgres_store import WRITER  # psycopg only with PostgreSQL

        self._rows = WRITER

    def insert_events(self, db: Any, rows: list[EventRow]) -> set[tuple[str, str]]:
        with db.connection.cursor() as cursor:
            keys = "COPY event_keys (source, id, received_at, heartbeat) FROM STDIN"
            with cursor.copy(keys) as copy:
                for source, id_, type_, _i, _n, _t, received, _g, _b in rows:
                    copy.write_row((source, id_, received, type_ == contract.HEARTBEAT))
            with cursor.copy(f"COPY events ({partitions.EVENT_COLUMNS}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        return {(row[0], row[1]) for row in rows}

    def upsert_instances(self, db: Any, rows: list[InstanceRow]) -> None:
        self._rows.upsert_instances(db, rows)

    def upsert_notices(self, db: Any, rows: list[tuple[Any, ...]]) -> None:
        self._rows.upsert_notices(db, rows)


def writer_of(store: Store) -> Writer:
    postgres = isinstance(store, Prunable) and store.dialect == "postgresql"
    return PostgresBulk() if postgres else SqliteBulk()


async def fill(store: Store, batch: Batch) -> None:
    """One chunk into one open store: ingest's `apply` with the bulk event writer."""
    writer = writer_of(store)
    result = await store.transaction(lambda db: apply(db, batch, writer))
    if result.accepted != len(batch.accepted):
        raise RuntimeError(f"pre-fill: {result.accepted} of {len(batch.accepted)} stored")


async def prefill(
    urls: list[str],
    bodies: Iterable[bytes],
    *,
    ingest: str = "http",
    received_at: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[float]:
    """`bodies` into every store of `urls` at once (written and decoded once, each chunk
    into the stores side by side); seconds spent in each store. `received_at` backdates
    the receive time (a backlog for retention to prune); by default it is now."""
    stores = [build_store(url) for url in urls]
    spent = [0.0] * len(stores)
    for store in stores:
        await store.open()
    try:
        done = 0
        for chunk in _chunks(bodies, CHUNK):
            accepted = [Accepted(contract.from_cloudevent(body), body) for body in chunk]
            at = time.time() if received_at is None else received_at
            batch = Batch(ingest=ingest, received_at=at, accepted=accepted)

            async def timed(index: int, store: Store, batch: Batch) -> None:
                began = time.perf_counter()
                await fill(store, batch)
                spent[index] += time.perf_counter() - began

            await asyncio.gather(*(timed(n, store, batch) for n, store in enumerate(stores)))
            done += len(chunk)
            if progress is not None:
                progress(done)
    finally:
        for store in stores:
            await store.close()
    return spent
