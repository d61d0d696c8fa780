"""The outbox: every CloudEvent is on disk before any sink sees it.

Guarantees (SQLite in `state.dir`, WAL journal):
- `commit` stores a watcher's new events *and* its checkpoint in one transaction: when it
  returns, both survive a power cut, and a crash before it returns loses neither (the
  watcher, restarted from the old checkpoint, sees the same transition again and announces
  it with the same deterministic id).
- A commit is one call on the spool's thread: the transaction (written with
  `synchronous=NORMAL`), then, for each sink whose worker waits for new events (its queue
  was empty: `waiting`), the window that worker would read next, then the fsync of the WAL
  file (`fdatasync` where it exists, as SQLite's own `synchronous=FULL` does). Only then is
  the dispatcher woken, and an idle worker takes its window from the commit instead of
  reading the spool again (`pending`), so a notice costs one trip to the spool's thread,
  not three (commit, fsync, read), and nothing is ever sent that a power cut could take
  back. `commit` returns at that moment too, so the watcher's checkpoint is acknowledged
  exactly as late as with `synchronous=FULL`. A failed fsync fails the commit
  (`SpoolError`) like a failed write: its events stay unsent (`durable`) until an fsync
  succeeds, the watcher retries the commit (same ids, `INSERT OR IGNORE`) and the retry
  fsyncs again.
- An event is pending once per sink configured when it was committed, and leaves a sink's
  queue only when that sink acknowledged it (`ack`) or rejected it for good (`dead_letter`,
  kept with the reason until replayed or purged). Sinks are independent: a dead webhook
  holds back nobody else.
- Within a sink, events are handed out oldest first (by `seq`), which is the order the
  watchers observed them, so per-instance order holds.
- Acknowledgements are written with `synchronous=NORMAL`: an ack lost in a power cut only
  means one more delivery of an event with the same id (at-least-once), never a loss, and it
  keeps the drain rate high.
- Duplicate ids are ignored on insert, so a transition is spooled once however often it is
  announced.
- Bounded queues: when a sink has more than `max_pending` events waiting (it has been down
  for a very long time), the oldest ones beyond the bound are moved to the dead-letter table
  with the reason "spool full", counted in `overflowed` and logged by the caller. Nothing is
  deleted: `maintenance-bridge spool replay` sends them once the sink is back. The bound keeps
  a recovered sink from being flooded with stale notices ahead of current ones.
- Actions (hook runs, approvals; bridge/actions/engine.py) keep their state in the same database:
  an action is *planned* in the transaction that commits the notice it answers, so a crash
  right after the commit does not forget it, and it is marked done in the transaction that
  commits its audit event, so the two cannot disagree. The notices in force (what the status
  API serves) are kept there too, in the notices' transaction, so a restart knows them.
- Disk full (or any write failure) raises `SpoolError` with a clear message and rolls the
  transaction back: the events and the checkpoint are either both stored or both not.
- The spool names its format and the release that last opened it (`FORMAT` in SQLite's
  `PRAGMA user_version`, the version in the `meta` table), so a release never misreads
  state it does not know: a spool of a newer format is refused at open with a line naming
  the release that wrote it, never changed. Builds before 0.2.0 neither write nor read
  these (docs/operations.md, "Rolling out"): their spools are format 0, which is format 1
  without the `meta` table.

All database work runs on one dedicated thread, the commits' fsyncs included, so the event
loop never blocks on the disk.

The SQL lives beside this module, one job each: `spool_schema` (tables, format, the checks
at open), `spool_outbox` (events and the sinks' queues), `spool_dead_letters` (refused and
overflowed events, replay, purge), `spool_state` (checkpoints, actions, notices in force);
`spool_records` holds the rows and `SpoolError`. `Spool` runs them on its thread and keeps
the durability and health bookkeeping; importers take every name from here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from bridge.infra.prometheus import PREFIX, Exposition
from bridge.pipeline import spool_dead_letters, spool_outbox, spool_state
from bridge.pipeline.spool_dead_letters import DEFAULT_MAX_PENDING, SPOOL_FULL
from bridge.pipeline.spool_records import Action, DeadLetter, NewEvent, Spooled, SpoolError
from bridge.pipeline.spool_schema import DB_NAME, FORMAT, integrity, open_database, written_by

__all__ = [
    "DB_NAME",
    "DEFAULT_MAX_PENDING",
    "FORMAT",
    "SPOOL_FULL",
    "Action",
    "DeadLetter",
    "NewEvent",
    "Spool",
    "SpoolError",
    "SpoolHealth",
    "Spooled",
    "integrity",
    "written_by",
]

T = TypeVar("T")
log = logging.getLogger("bridge.spool")


@dataclass(slots=True)
class SpoolHealth:
    """Since when one kind of spool access (reads or writes) has been failing, and why."""

    failing_since: float | None = None
    last_error: str | None = None

    def failed(self, error: str) -> None:
        self.failing_since = self.failing_since or time.time()
        self.last_error = error

    def succeeded(self) -> None:
        self.failing_since = None


@dataclass(frozen=True, slots=True)
class _Committed:
    """What a commit's call on the spool's thread did (see `Spool.commit`)."""

    added: list[int]
    overflow: dict[str, int]
    #: Per waiting sink: the window size and the window read right after the transaction.
    windows: dict[str, tuple[int, list[Spooled]]]
    #: The fsync failed: the transaction is written (it survives kill -9), not durable.
    fsync_error: SpoolError | None


#: Sync a file's data and size, not its times (`fsync` where `fdatasync` does not exist).
_sync_data: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


class Spool:
    """The SQLite outbox and the watchers' checkpoints (see the module docstring)."""

    def __init__(
        self, directory: Path, sinks: Sequence[str], max_pending: int = DEFAULT_MAX_PENDING
    ) -> None:
        self.path = directory / DB_NAME
        self.sinks = list(sinks)
        self.max_pending = max_pending
        #: Events moved to the dead letters because a sink's queue was full, per sink.
        self.overflowed: dict[str, int] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spool")
        self._db: sqlite3.Connection | None = None
        #: Whether reading and writing work right now (for readiness and liveness).
        self.reads = SpoolHealth()
        self.writes = SpoolHealth()
        #: Set by every commit that adds events (see `new_events`).
        self._new_events: list[asyncio.Event] = []
        #: Seqs committed but not yet fsynced, and the signal of the next successful fsync.
        self._unsynced: set[int] = set()
        self._fsynced = asyncio.Event()
        #: Sinks whose worker found its queue empty and waits, with the size of the window
        #: it reads (`waiting`); a commit reads that window for it (`_prefetched`).
        self._waiting: dict[str, int] = {}
        self._prefetched: dict[str, tuple[int, list[Spooled]]] = {}

    # -- plumbing ---------------------------------------------------------------------------

    async def _run(
        self, fn: Callable[[sqlite3.Connection], T], *, write: bool = False, track: bool = True
    ) -> T:
        """Run `fn` on the spool's thread; its outcome sets `reads` or `writes` health unless
        `track` is False (a PRAGMA that reads no table says nothing about them)."""
        loop = asyncio.get_running_loop()
        health = self.writes if write else self.reads
        try:
            result = await loop.run_in_executor(self._executor, self._call, fn)
        except SpoolError as exc:
            if track:
                health.failed(str(exc))
            raise
        if track:
            health.succeeded()
        return result

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        # Any other write may change a queue: a window read by a commit is no longer sure.
        self._prefetched.clear()
        return await self._run(fn, write=True)

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._db is None:
            raise SpoolError("the spool is not open")
        try:
            return fn(self._db)
        except sqlite3.OperationalError as exc:
            if self._db.in_transaction:
                self._db.rollback()
            if "full" in str(exc).lower():
                raise SpoolError(f"disk full: cannot write the spool {self.path}: {exc}") from exc
            raise SpoolError(f"spool {self.path}: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            if self._db.in_transaction:
                self._db.rollback()
            raise SpoolError(f"spool {self.path}: {exc}") from exc

    def open_sync(self) -> None:
        """Open (or create) the spool; `SpoolError` with what to do when it cannot be used
        (`spool_schema.open_database`: a damaged spool is refused, never set aside)."""
        self._db = open_database(self.path)

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self.open_sync)

    async def close(self) -> None:
        def _close(db: sqlite3.Connection) -> None:
            db.close()

        if self._db is not None:
            await self._run(_close)
            self._db = None
        self._executor.shutdown(wait=True)

    def _fsync(self) -> None:
        """Make every transaction committed so far survive a power cut: sync the WAL file's
        data (what `synchronous=FULL` does at each commit, with `fdatasync` where the system
        has it: the file's size is synced with its data, its times are not). Runs on the
        spool's thread, right after the commit's transaction.

        Without a WAL file (never written, or checkpointed away), everything committed is in
        the database file, so that one is synced instead.
        """
        for path in (self.path.with_name(self.path.name + "-wal"), self.path):
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise SpoolError(f"cannot open {path} to make the spool durable: {exc}") from exc
            try:
                _sync_data(fd)
            except OSError as exc:
                raise SpoolError(f"fsync of {path} failed: {exc}") from exc
            finally:
                os.close(fd)
            return
        raise SpoolError(f"the spool {self.path} is gone")

    async def durable(self, seqs: Sequence[int]) -> None:
        """Wait until the commits that added `seqs` are fsynced (at once when they are): only
        the events of a commit whose fsync failed wait, until a later fsync succeeds."""
        while not self._unsynced.isdisjoint(seqs):
            await self._fsynced.wait()

    # -- writing ----------------------------------------------------------------------------

    async def commit(
        self,
        events: Sequence[NewEvent],
        checkpoints: dict[str, Any] | None = None,
        *,
        plan: Mapping[str, str] | None = None,
        states: Mapping[str, str] | None = None,
        in_force: Mapping[str, bytes | None] | None = None,
    ) -> list[int]:
        """Store events and checkpoints atomically and durably; return the new seqs.

        Returns once the transaction is written and fsynced; the dispatcher is woken then,
        and a waiting worker finds its next window read already (see the module docstring).

        In the same transaction: `plan` adds actions (key: detail) in state `planned` unless
        the key exists already; `states` sets existing actions' states; `in_force` sets
        (bytes) or clears (None) the notices in force.
        """
        sinks, bound, waiting = list(self.sinks), self.max_pending, dict(self._waiting)
        unsynced = set(self._unsynced)

        def write(db: sqlite3.Connection) -> _Committed:
            added, overflow = spool_outbox.commit(
                db,
                time.time(),
                events,
                sinks,
                bound,
                checkpoints=checkpoints or {},
                plan=plan or {},
                states=states or {},
                in_force=in_force or {},
            )
            windows = {
                sink: (limit, spool_outbox.pending(db, sink=sink, limit=limit, after=0))
                for sink, limit in waiting.items()
                if added
            }
            try:
                self._fsync()
            except SpoolError as exc:
                return _Committed(added, overflow, {}, exc)
            return _Committed(added, overflow, windows, None)

        self._prefetched.clear()
        done = await self._run(write, write=True)
        for sink, count in done.overflow.items():
            self.overflowed[sink] = self.overflowed.get(sink, 0) + count
            log.error(
                "sink %s: %d waiting event(s) moved to the dead letters (%s, now %d in all); "
                "replay them with `maintenance-bridge spool replay --sink %s`",
                sink,
                count,
                SPOOL_FULL,
                self.overflowed[sink],
                sink,
            )
        if done.fsync_error is not None:
            # Written but not durable: the events stay unsent until an fsync succeeds.
            self._unsynced.update(done.added)
            self.writes.failed(str(done.fsync_error))
            raise done.fsync_error
        # Everything committed before this fsync is durable now.
        self._unsynced -= unsynced
        signal, self._fsynced = self._fsynced, asyncio.Event()
        signal.set()
        for sink, window in done.windows.items():
            if self._waiting.get(sink) == window[0]:
                self._prefetched[sink] = window
        if events:
            for wakeup in self._new_events:
                wakeup.set()
        return done.added

    async def export(self, out: Exposition) -> None:
        """The spool's figures for `/metrics`: overflow, depth and age per sink."""
        out.add(
            PREFIX + "spool_overflowed_total",
            "counter",
            "Events moved to the dead letters because the sink's queue hit delivery.max_pending.",
            [({"sink": name}, self.overflowed.get(name, 0)) for name in self.sinks],
        )
        try:
            depth = await self.depth()
        except SpoolError:  # /readyz says why; the other figures are still worth having
            depth = {}
        now = time.time()
        out.add(
            PREFIX + "spool_pending",
            "gauge",
            "Events spooled and not yet delivered, per sink.",
            [({"sink": name}, depth.get(name, (0, None))[0]) for name in self.sinks],
        )
        out.add(
            PREFIX + "spool_oldest_pending_age_seconds",
            "gauge",
            "Age of the oldest undelivered event per sink (0 when none is waiting).",
            [
                (
                    {"sink": name},
                    max(0.0, now - oldest) if (oldest := depth.get(name, (0, None))[1]) else 0,
                )
                for name in self.sinks
            ],
        )

    def new_events(self) -> asyncio.Event:
        """An event this spool sets whenever a commit adds events: the dispatcher waits on
        it, so whoever commits (a watcher's update, an action's audit event, a heartbeat)
        never has to tell the dispatcher. The waiter clears it before reading."""
        signal = asyncio.Event()
        self._new_events.append(signal)
        return signal

    async def ack(self, sink: str, seqs: Sequence[int]) -> None:
        await self._write(partial(spool_outbox.ack, sink=sink, seqs=seqs))

    async def record_attempt(self, sink: str, seqs: Sequence[int], error: str) -> None:
        await self._write(partial(spool_outbox.record_attempt, sink=sink, seqs=seqs, error=error))

    async def dead_letter(self, sink: str, seqs: Sequence[int], reason: str) -> None:
        """Move events out of a sink's queue into the dead-letter table, with the reason."""
        now = time.time()
        await self._write(
            partial(spool_dead_letters.dead_letter, sink=sink, seqs=seqs, reason=reason, now=now)
        )

    async def replay(self, sink: str | None = None, seqs: Sequence[int] | None = None) -> int:
        """Put dead letters back in their sink's queue; return how many."""
        return await self._write(partial(spool_dead_letters.replay, sink=sink, seqs=seqs))

    async def purge(self, sink: str | None = None, seqs: Sequence[int] | None = None) -> int:
        """Delete dead letters for good; return how many."""
        return await self._write(partial(spool_dead_letters.purge, sink=sink, seqs=seqs))

    # -- reading ----------------------------------------------------------------------------

    def waiting(self, sink: str, limit: int) -> None:
        """`sink`'s worker found its queue empty and waits for new events: the next commit
        that adds some reads the window of `limit` events it will ask `pending` for."""
        self._waiting[sink] = limit

    async def pending(self, sink: str, limit: int, after: int = 0) -> list[Spooled]:
        """The oldest events not yet acknowledged by `sink`, from seq `after` on (exclusive:
        the dispatcher skips events delivered whose acknowledgement is still being written).

        A worker that was `waiting` gets the window the last commit read for it, without
        another trip to the spool's thread (nothing was written since: any other write
        drops it; a commit after it read a newer one)."""
        self._waiting.pop(sink, None)
        prefetched = self._prefetched.pop(sink, None)
        if prefetched is not None and after == 0 and prefetched[0] == limit:
            return prefetched[1]
        return await self._run(partial(spool_outbox.pending, sink=sink, limit=limit, after=after))

    async def data_version(self) -> int:
        """SQLite's `PRAGMA data_version`: changes when another process commits to the spool
        (`maintenance-bridge spool replay`), not when this connection does. One cheap read:
        the dispatcher checks it while idle to notice a replay without a wake-up."""

        def _version(db: sqlite3.Connection) -> int:
            (version,) = db.execute("PRAGMA data_version").fetchone()
            return int(version)

        return await self._run(_version, track=False)

    async def load_checkpoint(self, name: str) -> dict[str, Any] | None:
        return await self._run(partial(spool_state.checkpoint, name=name))

    async def actions(self, states: Sequence[str] | None = None) -> list[Action]:
        """Actions in one of `states` (None: all), oldest first."""
        return await self._run(partial(spool_state.actions, states=states))

    async def action_state(self, key: str) -> str | None:
        return await self._run(partial(spool_state.action_state, key=key))

    async def in_force(self) -> dict[str, bytes]:
        """The notices in force as last committed (key: the CloudEvent's bytes)."""
        return await self._run(spool_state.in_force)

    async def depth(self) -> dict[str, tuple[int, float | None]]:
        """Per sink: pending count and the creation time of its oldest pending event."""
        return await self._run(spool_outbox.depth)

    async def dead_letters(self, sink: str | None = None) -> list[DeadLetter]:
        return await self._run(partial(spool_dead_letters.listed, sink=sink))
