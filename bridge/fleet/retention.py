"""How long the fleet store keeps what, and the pruner that makes it so, in small batches.

```toml
[fleet.retention]
events_days = 400          # the audit log (maintenance, approvals, hook outcomes, ...)
heartbeats_days = 7        # heartbeat events: the instance row keeps the last one anyway
rejected_days = 30         # refused inputs, and at most `rejected_rows` of them
rejected_rows = 100000
retire_after_days = 30     # an instance not heard from for this long is `retired`
```

Why these defaults: 400 days covers a yearly audit with a month to spare (what compliance
teams ask of an audit trail); heartbeats are most of the rows (one per VM every few minutes)
and say nothing once the instance row holds the latest, so a week is enough to look back at
an outage; refused inputs are for debugging a sender, bounded in age and in count so a
misbehaving sender cannot fill the disk.

An instance is retired, not deleted: it stays listed with `state = "retired"` (and
`retired_at`), its notices and audit events stay, and the next event from it makes it
active again. A VM that was deleted simply stops reporting; retiring it keeps it out of the
`silent` alarms without losing its history.

The pruner never stalls ingest or reads: every batch is its own short write transaction of
at most `batch_rows` rows (found through an index, or the oldest rows by sequence; the
retirement walks the instances in source order, a batch of them at a time), with
`batch_pause` seconds between batches, so an ingest waits at most one batch for the write
lock and a backlog of a year is worked off over many passes rather than in one. A batch
that held the writer, its commit included, longer than `batch_seconds` (a busy or slow
database) makes the next one smaller, so "one batch" stays short however loaded the
machine is; a pass starts small and grows while batches are quick. No batch reads more
than it changes: each statement seeks an index (`tests/fleet/test_retention.py` checks
the plans), since one sort or scan of a large table inside the writer's transaction is
what an ingest behind it waits for. Reads run
beside it (SQLite's WAL, PostgreSQL's MVCC). On PostgreSQL the audit log is partitioned by
month of receive time (`bridge.fleet.migrations`): a month entirely older than the
retention is dropped as a whole instead (`DROP TABLE` of the partition is one catalog
change), and the de-duplication keys of those events are pruned in batches like the rest.

Each replica prunes; the statements are idempotent, so two replicas pruning at once only
share the work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, Final, Protocol, TypeVar, runtime_checkable

import msgspec

from bridge import contract
from bridge.fleet import partitions, tallies
from bridge.fleet.store import StoreError

log = logging.getLogger("bridge.fleet.retention")
#: The smallest batch the pruner shrinks to on a slow database (it still makes progress).
MIN_BATCH_ROWS: Final = 100
T = TypeVar("T")
DAY: Final = 86400.0
_HEARTBEAT: Final = contract.HEARTBEAT


class FleetRetention(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """`[fleet.retention]` (see the module docstring): days as numbers, fractions allowed."""

    enabled: bool = True
    events_days: Annotated[float, msgspec.Meta(ge=1)] = 400.0
    heartbeats_days: Annotated[float, msgspec.Meta(gt=0)] = 7.0
    rejected_days: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    rejected_rows: Annotated[int, msgspec.Meta(ge=100)] = 100_000
    retire_after_days: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    #: Seconds between two pruning passes.
    interval: Annotated[float, msgspec.Meta(ge=1, le=86400)] = 3600.0
    #: Rows one transaction deletes (or retires), at most.
    batch_rows: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 1000
    #: Seconds between two batches, so ingest and reads get the database in between.
    batch_pause: Annotated[float, msgspec.Meta(ge=0, le=60)] = 0.05
    #: Seconds one transaction should hold the writer, its commit included, at most: a
    #: batch that took longer makes the next one smaller (down to `MIN_BATCH_ROWS`), a
    #: quick one lets the next double, up to `batch_rows`; a pass starts at
    #: `MIN_BATCH_ROWS`. 0: every batch is `batch_rows`.
    batch_seconds: Annotated[float, msgspec.Meta(ge=0, le=60)] = 0.02

    def __post_init__(self) -> None:
        from bridge.infra.validation import FieldError

        if self.heartbeats_days > self.events_days:
            raise FieldError("heartbeats_days", "must not exceed events_days")


@dataclass(frozen=True, slots=True)
class Cutoffs:
    """What one pass removes: rows received before these Unix times, and the rest."""

    now: float
    events: float
    heartbeats: float
    rejected: float
    rejected_rows: int
    retire: float

    @classmethod
    def of(cls, policy: FleetRetention, now: float) -> Cutoffs:
        return cls(
            now=now,
            events=now - policy.events_days * DAY,
            heartbeats=now - policy.heartbeats_days * DAY,
            rejected=now - policy.rejected_days * DAY,
            rejected_rows=policy.rejected_rows,
            retire=now - policy.retire_after_days * DAY,
        )


@dataclass(slots=True)
class PruneReport:
    """Rows a pass removed (or retired), by kind."""

    heartbeats: int = 0
    events: int = 0
    rejected: int = 0
    retired: int = 0
    partitions: int = 0
    keys: int = 0

    def total(self) -> int:
        return (
            self.heartbeats
            + self.events
            + self.rejected
            + self.retired
            + self.partitions
            + self.keys
        )


@runtime_checkable
class Prunable(Protocol):
    """What the pruner needs of a store: one short write transaction at a time."""

    async def transaction(self, fn: Callable[[Any], T]) -> T:
        """Run `fn(db)` in one write transaction on the store's writer (`?` placeholders)."""

    @property
    def dialect(self) -> str:
        """`bridge.fleet.migrations` dialect name: "sqlite" or "postgresql"."""


# -- one batch each (plain SQL over a DB-API connection with `?` placeholders) ----------------


def prune_heartbeats(db: Any, cutoff: float, limit: int, *, sqlite: bool = False) -> int:
    """Heartbeat events received before `cutoff`, oldest first, through the partial index
    `events_heartbeat_received` (its condition is written as a literal so both planners can
    use it). SQLite has no statistics (the store never runs ANALYZE), so its planner takes
    the type's equality on `events_type_time` for the better index and then sorts every
    heartbeat kept, young ones included, in each batch: 15 ms at 18,000 heartbeats, growing
    with the fleet, inside the writer's transaction. `sqlite` names the index for it."""
    table = "events INDEXED BY events_heartbeat_received" if sqlite else "events"
    cursor = db.execute(
        f"DELETE FROM events WHERE seq IN (SELECT seq FROM {table} "  # noqa: S608 (constants)
        f"WHERE type = '{_HEARTBEAT}' AND received_at < ? ORDER BY received_at LIMIT ?)",
        (cutoff, limit),
    )
    return _counted(db, "events", int(cursor.rowcount))


def _counted(db: Any, table: str, deleted: int) -> int:
    """Take `deleted` rows of `table` off its kept count (`bridge.fleet.tallies`), in the
    transaction that deleted them; returns `deleted`."""
    if table == "rejected":
        tallies.bump(db, 0, -deleted)
    else:
        tallies.bump(db, -deleted, 0)  # `events`, or a partition of it
    return deleted


def prune_oldest(db: Any, table: str, cutoff: float, limit: int) -> int:
    """Rows of `table` (`events` or `rejected`) received before `cutoff`, walking the
    oldest by sequence: the batch stops at the first row that is young enough, so no index
    on the receive time is needed and nothing younger is ever deleted (the receive time is
    checked again in the DELETE: on PostgreSQL a sequence number can commit late)."""
    rows = db.execute(f"SELECT seq, received_at FROM {table} ORDER BY seq LIMIT ?", (limit,))  # noqa: S608
    last = None
    for seq, received_at in rows.fetchall():
        if received_at >= cutoff:
            break
        last = seq
    if last is None:
        return 0
    cursor = db.execute(
        f"DELETE FROM {table} WHERE seq <= ? AND received_at < ?",  # noqa: S608 (constant)
        (last, cutoff),
    )
    return _counted(db, table, int(cursor.rowcount))


def prune_rejected_beyond(db: Any, keep: int, limit: int) -> int:
    """The oldest refused inputs beyond the newest `keep`. How many there are is the kept
    count (`bridge.fleet.tallies`, exact: changed in the transactions that change the
    table), so the batch reads only the rows it deletes, where finding the newest
    `keep`-th by an OFFSET walked up to 100,000 index entries in the writer's transaction
    each pass. One statement, one snapshot: two replicas pruning at once delete a row
    once, never a batch each beyond the count."""
    cursor = db.execute(
        "DELETE FROM rejected WHERE seq IN (SELECT seq FROM rejected ORDER BY seq LIMIT "
        "(SELECT COALESCE(MAX(CASE WHEN n - ? <= 0 THEN 0 WHEN n - ? > ? THEN ? "
        "ELSE n - ? END), 0) FROM tallies WHERE kind = 'rejected' AND k1 = '' AND k2 = '' "
        "AND k3 = '' AND k4 = ''))",
        (keep, keep, limit, limit, keep),
    )
    return _counted(db, "rejected", int(cursor.rowcount))


def retire_silent(
    db: Any, cutoff: float, now: float, after: str, limit: int
) -> tuple[int, str | None]:
    """Mark retired (at `now`) the instances whose last event is older than `cutoff`,
    among the next `limit` instances in source order after `after` (a walk along the
    primary key): each batch reads a bounded number of rows whether few or many are silent,
    where a search for silent ones would scan the table for want of an index on
    `last_seen` (which every event changes: an index there would cost each event a write).
    Returns (instances retired, the last source walked; None when this was the end)."""
    last, walked = db.execute(
        "SELECT MAX(source), COUNT(*) FROM (SELECT source FROM instances WHERE source > ? "
        "ORDER BY source LIMIT ?) AS walked",
        (after, limit),
    ).fetchone()
    if last is None:
        return 0, None
    cursor = db.execute(
        "UPDATE instances SET retired_at = ? WHERE source > ? AND source <= ? "
        "AND retired_at IS NULL AND last_seen < ?",
        (now, after, last, cutoff),
    )
    return int(cursor.rowcount), last if walked == limit else None


def _call(fn: Callable[[Any, int], int], db: Any, limit: int) -> int:
    return fn(db, limit)


# -- the pass -------------------------------------------------------------------------------


class Pruner:
    """Runs a pass every `policy.interval` seconds while the service runs."""

    def __init__(
        self,
        store: Prunable,
        policy: FleetRetention,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Any] = asyncio.sleep,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.store = store
        self.policy = policy
        self.clock = clock
        self.sleep = sleep
        #: Times each transaction (`batch_seconds`).
        self.timer = timer
        self._task: asyncio.Task[None] | None = None
        #: Rows of the next batch (`_one`: follows how long a transaction takes).
        self._limit = self._first_limit()
        #: The last pass's report (metrics, tests).
        self.last: PruneReport | None = None

    async def _batches(self, fn: Callable[[Any, int], int]) -> int:
        """`fn(db, limit)` one batch per transaction until a batch comes back short."""
        total = 0
        while True:
            limit = self._limit
            done = await self._one(partial(_call, fn, limit=limit))
            total += done
            if done < limit:
                return total
            await self.sleep(self.policy.batch_pause)

    async def _one(self, fn: Callable[[Any], T]) -> T:
        """`fn(db)` in one transaction; the next batch's limit follows how long it held the
        writer (`batch_seconds`): on a database busy enough that 1,000 deletions hold the
        writer for a second, the batches shrink until one is short again, so an ingest
        waiting for the writer waits about that long at most; they grow back to
        `batch_rows` when it is quiet.

        Timed from the start of `fn` inside the transaction (the wait for the writer behind
        an ingest is not this batch's cost) to the transaction's return, so its COMMIT
        counts: writing and syncing the pages of 1,000 deletions from six indexes takes as
        long as finding them."""
        limit = self._limit
        began: float | None = None

        def timed(db: Any) -> T:
            nonlocal began
            began = self.timer()
            return fn(db)

        result = await self.store.transaction(timed)
        if began is not None:
            self._limit = self._next_limit(limit, self.timer() - began)
        return result

    async def _retire(self, cut: Cutoffs) -> int:
        """`retire_silent` along the instances, a batch of them per transaction."""
        total, after = 0, ""
        while True:
            limit = self._limit
            retired, last = await self._one(
                partial(retire_silent, cutoff=cut.retire, now=cut.now, after=after, limit=limit)
            )
            total += retired
            if last is None:
                return total
            after = last
            await self.sleep(self.policy.batch_pause)

    def _first_limit(self) -> int:
        """A pass starts small and doubles while batches are quick: its first batch of
        `batch_rows` held SQLite's writer for 120 ms on a loaded host, the slowest ingest
        of the pass."""
        most = self.policy.batch_rows
        return most if self.policy.batch_seconds <= 0 else min(MIN_BATCH_ROWS, most)

    def _next_limit(self, limit: int, took: float) -> int:
        target, most = self.policy.batch_seconds, self.policy.batch_rows
        if target <= 0:
            return most
        if took > target:
            return max(min(MIN_BATCH_ROWS, most), int(limit * target / took))
        if took < target / 2:
            return min(most, limit * 2)
        return limit

    async def run_pass(self) -> PruneReport:
        """One pass over every kind of row (see the module docstring)."""
        cut = Cutoffs.of(self.policy, self.clock())
        report = PruneReport()
        self._limit = self._first_limit()
        sqlite = self.store.dialect == "sqlite"
        report.heartbeats = await self._batches(
            lambda db, limit: prune_heartbeats(db, cut.heartbeats, limit, sqlite=sqlite)
        )
        audit = "events"
        if self.store.dialect == "postgresql":
            # Each gives up when a long read holds the locks it needs: the next pass retries.
            try:
                await self.store.transaction(lambda db: partitions.ensure_months(db, [cut.now]))
            except StoreError as exc:
                log.warning("retention: next month's partition not made this pass: %s", exc)
            try:
                report.partitions = await self.store.transaction(
                    lambda db: partitions.drop_older(db, cut.events)
                )
            except StoreError as exc:
                log.warning("retention: no month dropped this pass: %s", exc)
            keys_cutoff = partitions.keys_cutoff(cut.events)
            report.keys = await self._batches(
                lambda db, limit: partitions.prune_keys(db, True, cut.heartbeats, limit)
            )
            report.keys += await self._batches(
                lambda db, limit: partitions.prune_keys(db, False, keys_cutoff, limit)
            )
            audit = "events_default"  # the months go whole, above; only strays row by row
        report.events = await self._batches(
            lambda db, limit: prune_oldest(db, audit, cut.events, limit)
        )
        report.rejected = await self._batches(
            lambda db, limit: prune_oldest(db, "rejected", cut.rejected, limit)
        )
        report.rejected += await self._batches(
            lambda db, limit: prune_rejected_beyond(db, cut.rejected_rows, limit)
        )
        report.retired = await self._retire(cut)
        self.last = report
        if report.total():
            log.info("retention: removed %s", report)
        return report

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_pass()
            except Exception:  # a store error: the next pass tries again
                log.exception("retention pass failed; next one in %gs", self.policy.interval)
            await asyncio.sleep(self.policy.interval)

    def start(self) -> None:
        if self.policy.enabled and self._task is None:
            self._task = asyncio.create_task(self._loop(), name="fleet-retention")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
