"""The outbox: every CloudEvent is on disk before any sink sees it.

Guarantees (SQLite in `state.dir`, WAL journal):
- `commit` stores a watcher's new events *and* its checkpoint in one transaction: when it
  returns, both survive a power cut, and a crash before it returns loses neither (the
  watcher, restarted from the old checkpoint, sees the same transition again and announces
  it with the same deterministic id).
- The fsync overlaps the dispatcher's hand-off, not the send. The transaction commits with
  `synchronous=NORMAL` (written to the OS: from then on it survives kill -9), the
  dispatcher is woken at once and reads the new events from the spool while a second
  thread fsyncs the WAL file; it sends them only once that fsync is done (`durable`), and
  `commit` returns at that moment too, so the watcher's checkpoint is acknowledged exactly
  as late as with `synchronous=FULL`. Nothing is sent that a power cut could take back, and
  the bridge's own bookkeeping after a commit (the notices in force, the counters, the
  actions) still happens before any sink sees the event. A failed fsync fails the commit
  (`SpoolError`) like a failed write: the events stay unsent until an fsync succeeds, the
  watcher retries the commit (same ids, `INSERT OR IGNORE`) and the retry fsyncs again.
  (Sending during the fsync as well would save about another millisecond, but a sink
  could then hold a notice before the status API knows it, and a power cut could take
  back a delivered one.)
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

All database work runs on one dedicated thread, so the event loop never blocks on fsync;
the commits' fsyncs run on a second one, so reading the queue never waits for them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from bridge.infra.buildinfo import newer, version
from bridge.infra.prometheus import PREFIX, Exposition

T = TypeVar("T")
log = logging.getLogger("bridge.spool")

DB_NAME: Final = "spool.sqlite3"
#: The spool's format (SQLite's `PRAGMA user_version`). Raised only by a release whose
#: spool an older release would misread (a changed table, not a new one: older releases
#: leave tables they do not know alone); the release that raises it says so in CHANGELOG.md.
FORMAT: Final = 1
DEFAULT_MAX_PENDING: Final = 100_000
SPOOL_FULL: Final = "spool full: more than delivery.max_pending events waiting for this sink"
_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS events (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    id       TEXT NOT NULL UNIQUE,
    source   TEXT NOT NULL,
    type     TEXT NOT NULL,
    created  REAL NOT NULL,
    body     BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS pending (
    sink       TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    attempts   INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    PRIMARY KEY (sink, seq)
) WITHOUT ROWID;
-- Acknowledging looks events up by seq alone (is any sink still waiting for it?): without
-- this index each acknowledged event scanned the whole queue, quadratic in the backlog.
CREATE INDEX IF NOT EXISTS pending_by_seq ON pending (seq);
CREATE TABLE IF NOT EXISTS dead_letters (
    sink     TEXT NOT NULL,
    seq      INTEGER NOT NULL,
    reason   TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    at       REAL NOT NULL,
    PRIMARY KEY (sink, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS watcher_state (
    name    TEXT PRIMARY KEY,
    state   TEXT NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS actions (
    key     TEXT PRIMARY KEY,
    state   TEXT NOT NULL,
    detail  TEXT NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS in_force (
    key   TEXT PRIMARY KEY,
    body  BLOB NOT NULL
);
-- written_by: the version of the release that last opened the spool.
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


class SpoolError(Exception):
    """The spool cannot store or read (disk full, permissions, corruption)."""


def integrity(path: Path) -> str:
    """SQLite's own `quick_check` of the spool at `path`, opened read-only: "ok" or what is
    wrong (for `doctor`, which must never change the spool a running bridge uses)."""
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        return f"cannot open it: {exc}"
    try:
        rows = db.execute("PRAGMA quick_check").fetchall()
    except sqlite3.Error as exc:
        return str(exc)
    finally:
        db.close()
    return "; ".join(str(row[0]) for row in rows[:5])


def written_by(db: sqlite3.Connection) -> str | None:
    """The version of the release that last opened the spool (None before 0.2.0)."""
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'written_by'").fetchone()
    except sqlite3.OperationalError:  # no meta table: a spool of a build before 0.2.0
        return None
    return str(row[0]) if row else None


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
class Spooled:
    seq: int
    id: str
    body: bytes
    attempts: int


@dataclass(frozen=True, slots=True)
class NewEvent:
    id: str
    source: str
    type: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Action:
    """One row of the actions table: `detail` is the JSON the planner stored with it."""

    key: str
    state: str
    detail: str


@dataclass(frozen=True, slots=True)
class DeadLetter:
    sink: str
    seq: int
    id: str
    type: str
    reason: str
    attempts: int
    at: float


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
        self._directory = directory
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spool")
        #: Where the commits' fsyncs run, so that the dispatcher's read of a new event (on
        #: the spool thread) overlaps the fsync of the transaction that added it.
        self._syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spool-fsync")
        self._db: sqlite3.Connection | None = None
        #: Whether reading and writing work right now (for readiness and liveness).
        self.reads = SpoolHealth()
        self.writes = SpoolHealth()
        #: Set by every commit that adds events (see `new_events`).
        self._new_events: list[asyncio.Event] = []
        #: Seqs committed but not yet fsynced, and the signal of the next successful fsync.
        self._unsynced: set[int] = set()
        self._fsynced = asyncio.Event()

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
        """Open (or create) the spool; `SpoolError` with what to do when it cannot be used.

        A spool that is not a database, is damaged or cannot be opened is refused, never set
        aside automatically: it may hold undelivered notices, and only an operator can decide
        that they are lost. The error names the file and the way out.
        """
        try:
            self._directory.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise SpoolError(f"cannot open the spool {self.path}: {exc}") from exc
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=5000")
            (verdict,) = db.execute("PRAGMA quick_check").fetchone()
            if verdict != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {verdict}")
            self._claim(db)
        except SpoolError:
            db.close()
            raise
        except (OSError, sqlite3.Error) as exc:
            db.close()
            raise SpoolError(
                f"cannot use the spool {self.path}: {exc}. If it is damaged, move it aside "
                f"(mv {self.path} {self.path}.damaged, with its -wal file if any) and start again "
                "with an empty spool; "
                "the notices it held can be read from the moved file with sqlite3's .recover"
            ) from exc
        self._db = db

    def _claim(self, db: sqlite3.Connection) -> None:
        """Refuse a spool of a newer format (naming the release that wrote it); else create
        what is missing and record this release as the last to open it."""
        (found,) = db.execute("PRAGMA user_version").fetchone()
        writer = written_by(db)
        if found > FORMAT:
            raise SpoolError(
                f"the spool {self.path} was written by maintenance-bridge {writer or 'unknown'} "
                f"(spool format {found}); this is {version()}, which reads spool format "
                f"{FORMAT} at most. Upgrade again to {writer or 'that release'} or newer; nothing "
                "in the spool was changed"
            )
        if writer is not None and newer(writer, version()):
            log.warning(
                "the spool %s was last opened by maintenance-bridge %s, newer than this %s; "
                "its format %d is this release's, so it is used as it is",
                self.path,
                writer,
                version(),
                found,
            )
        db.executescript(_SCHEMA)
        db.execute("BEGIN IMMEDIATE")
        db.execute(f"PRAGMA user_version = {FORMAT}")
        db.execute(
            "INSERT INTO meta (key, value) VALUES ('written_by', ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (version(),),
        )
        db.execute("COMMIT")

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
        self._syncer.shutdown(wait=True)

    def _fsync(self) -> None:
        """Make every transaction committed so far survive a power cut: fsync the WAL file
        (what `synchronous=FULL` does at each commit). Runs on the fsync thread.

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
                os.fsync(fd)
            except OSError as exc:
                raise SpoolError(f"fsync of {path} failed: {exc}") from exc
            finally:
                os.close(fd)
            return
        raise SpoolError(f"the spool {self.path} is gone")

    async def _durable(self) -> None:
        """`_fsync` on the fsync thread; a failure counts as a failed write. A success makes
        every seq committed before it durable and wakes whoever waits in `durable`."""
        covered = set(self._unsynced)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._syncer, self._fsync)
        except SpoolError as exc:
            self.writes.failed(str(exc))
            raise
        self._unsynced -= covered
        signal, self._fsynced = self._fsynced, asyncio.Event()
        signal.set()

    async def durable(self, seqs: Sequence[int]) -> None:
        """Wait until the commits that added `seqs` are fsynced (at once when they are): the
        dispatcher reads new events during the fsync and sends them after it."""
        while not self._unsynced.isdisjoint(seqs):
            await self._fsynced.wait()

    # -- writing ----------------------------------------------------------------------------

    @staticmethod
    def _commit(
        db: sqlite3.Connection,
        events: Sequence[NewEvent],
        checkpoints: dict[str, Any],
        sinks: Sequence[str],
        max_pending: int,
        plan: Mapping[str, str],
        states: Mapping[str, str],
        in_force: Mapping[str, bytes | None],
    ) -> tuple[list[int], dict[str, int]]:
        now = time.time()
        added: list[int] = []
        db.execute("PRAGMA synchronous=NORMAL")  # `commit` fsyncs after waking the dispatcher
        db.execute("BEGIN IMMEDIATE")
        for event in events:
            cursor = db.execute(
                "INSERT OR IGNORE INTO events (id, source, type, created, body) "
                "VALUES (?, ?, ?, ?, ?)",
                (event.id, event.source, event.type, now, event.body),
            )
            if cursor.rowcount:
                seq = cursor.lastrowid
                assert seq is not None
                added.append(seq)
                db.executemany(
                    "INSERT INTO pending (sink, seq) VALUES (?, ?)", [(s, seq) for s in sinks]
                )
        for name, state in checkpoints.items():
            db.execute(
                "INSERT INTO watcher_state (name, state, updated) VALUES (?, ?, ?) "
                "ON CONFLICT(name) DO UPDATE SET state = excluded.state, "
                "updated = excluded.updated",
                (name, json.dumps(state), now),
            )
        db.executemany(
            "INSERT OR IGNORE INTO actions (key, state, detail, updated) "
            "VALUES (?, 'planned', ?, ?)",
            [(key, detail, now) for key, detail in plan.items()],
        )
        db.executemany(
            "INSERT INTO actions (key, state, detail, updated) VALUES (?, ?, '{}', ?) "
            "ON CONFLICT(key) DO UPDATE SET state = excluded.state, updated = excluded.updated",
            [(key, state, now) for key, state in states.items()],
        )
        for key, body in in_force.items():
            if body is None:
                db.execute("DELETE FROM in_force WHERE key = ?", (key,))
            else:
                db.execute("INSERT OR REPLACE INTO in_force (key, body) VALUES (?, ?)", (key, body))
        overflow: dict[str, int] = {}
        for sink in sinks if added else ():
            (count,) = db.execute("SELECT COUNT(*) FROM pending WHERE sink = ?", (sink,)).fetchone()
            if count > max_pending:
                oldest = db.execute(
                    "SELECT seq FROM pending WHERE sink = ? ORDER BY seq LIMIT ?",
                    (sink, count - max_pending),
                ).fetchall()
                db.executemany(
                    "INSERT OR REPLACE INTO dead_letters (sink, seq, reason, attempts, at) "
                    "SELECT sink, seq, ?, attempts, ? FROM pending WHERE sink = ? AND seq = ?",
                    [(SPOOL_FULL, now, sink, seq) for (seq,) in oldest],
                )
                db.executemany(
                    "DELETE FROM pending WHERE sink = ? AND seq = ?", [(sink, q) for (q,) in oldest]
                )
                overflow[sink] = len(oldest)
        db.execute("COMMIT")
        return added, overflow

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

        The dispatcher is woken as soon as the transaction is written; this returns once it
        is also fsynced (see the module docstring: the fsync overlaps the hand-off).

        In the same transaction: `plan` adds actions (key: detail) in state `planned` unless
        the key exists already; `states` sets existing actions' states; `in_force` sets
        (bytes) or clears (None) the notices in force.
        """
        sinks, bound = list(self.sinks), self.max_pending
        added, overflow = await self._write(
            lambda db: self._commit(
                db,
                events,
                checkpoints or {},
                sinks,
                bound,
                plan or {},
                states or {},
                in_force or {},
            )
        )
        for sink, count in overflow.items():
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
        self._unsynced.update(added)
        if events:
            for signal in self._new_events:
                signal.set()
        await self._durable()
        return added

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
        def _ack(db: sqlite3.Connection) -> None:
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("BEGIN IMMEDIATE")
            db.executemany(
                "DELETE FROM pending WHERE sink = ? AND seq = ?", [(sink, s) for s in seqs]
            )
            self._collect(db, seqs)
            db.execute("COMMIT")

        await self._run(_ack, write=True)

    async def record_attempt(self, sink: str, seqs: Sequence[int], error: str) -> None:
        def _record(db: sqlite3.Connection) -> None:
            db.execute("PRAGMA synchronous=NORMAL")
            db.executemany(
                "UPDATE pending SET attempts = attempts + 1, last_error = ? "
                "WHERE sink = ? AND seq = ?",
                [(error, sink, s) for s in seqs],
            )

        await self._run(_record, write=True)

    async def dead_letter(self, sink: str, seqs: Sequence[int], reason: str) -> None:
        """Move events out of a sink's queue into the dead-letter table, with the reason."""

        def _dead(db: sqlite3.Connection) -> None:
            db.execute("PRAGMA synchronous=FULL")
            db.execute("BEGIN IMMEDIATE")
            now = time.time()
            for seq in seqs:
                db.execute(
                    "INSERT OR REPLACE INTO dead_letters (sink, seq, reason, attempts, at) "
                    "SELECT sink, seq, ?, attempts + 1, ? FROM pending WHERE sink = ? AND seq = ?",
                    (reason, now, sink, seq),
                )
                db.execute("DELETE FROM pending WHERE sink = ? AND seq = ?", (sink, seq))
            db.execute("COMMIT")

        await self._run(_dead, write=True)

    @staticmethod
    def _collect(db: sqlite3.Connection, seqs: Sequence[int]) -> None:
        """Drop event bodies that no sink needs any more."""
        db.executemany(
            "DELETE FROM events WHERE seq = ? "
            "AND NOT EXISTS (SELECT 1 FROM pending WHERE pending.seq = events.seq) "
            "AND NOT EXISTS (SELECT 1 FROM dead_letters WHERE dead_letters.seq = events.seq)",
            [(s,) for s in seqs],
        )

    # -- reading ----------------------------------------------------------------------------

    async def pending(self, sink: str, limit: int, after: int = 0) -> list[Spooled]:
        """The oldest events not yet acknowledged by `sink`, from seq `after` on (exclusive:
        the dispatcher skips events delivered whose acknowledgement is still being written)."""

        def _pending(db: sqlite3.Connection) -> list[Spooled]:
            rows = db.execute(
                "SELECT e.seq, e.id, e.body, p.attempts FROM pending p "
                "JOIN events e ON e.seq = p.seq WHERE p.sink = ? AND p.seq > ? "
                "ORDER BY p.seq LIMIT ?",
                (sink, after, limit),
            ).fetchall()
            return [Spooled(seq, id_, bytes(body), attempts) for seq, id_, body, attempts in rows]

        return await self._run(_pending)

    async def data_version(self) -> int:
        """SQLite's `PRAGMA data_version`: changes when another process commits to the spool
        (`maintenance-bridge spool replay`), not when this connection does. One cheap read:
        the dispatcher checks it while idle to notice a replay without a wake-up."""

        def _version(db: sqlite3.Connection) -> int:
            (version,) = db.execute("PRAGMA data_version").fetchone()
            return int(version)

        return await self._run(_version, track=False)

    async def load_checkpoint(self, name: str) -> dict[str, Any] | None:
        def _load(db: sqlite3.Connection) -> dict[str, Any] | None:
            row = db.execute("SELECT state FROM watcher_state WHERE name = ?", (name,)).fetchone()
            return json.loads(row[0]) if row else None

        return await self._run(_load)

    async def actions(self, states: Sequence[str] | None = None) -> list[Action]:
        """Actions in one of `states` (None: all), oldest first."""

        def _actions(db: sqlite3.Connection) -> list[Action]:
            rows = db.execute("SELECT key, state, detail FROM actions ORDER BY rowid").fetchall()
            return [Action(*row) for row in rows if states is None or row[1] in states]

        return await self._run(_actions)

    async def action_state(self, key: str) -> str | None:
        def _state(db: sqlite3.Connection) -> str | None:
            row = db.execute("SELECT state FROM actions WHERE key = ?", (key,)).fetchone()
            return str(row[0]) if row else None

        return await self._run(_state)

    async def in_force(self) -> dict[str, bytes]:
        """The notices in force as last committed (key: the CloudEvent's bytes)."""

        def _in_force(db: sqlite3.Connection) -> dict[str, bytes]:
            rows = db.execute("SELECT key, body FROM in_force ORDER BY rowid").fetchall()
            return {key: bytes(body) for key, body in rows}

        return await self._run(_in_force)

    async def depth(self) -> dict[str, tuple[int, float | None]]:
        """Per sink: pending count and the creation time of its oldest pending event."""

        def _depth(db: sqlite3.Connection) -> dict[str, tuple[int, float | None]]:
            rows = db.execute(
                "SELECT p.sink, COUNT(*), MIN(e.created) FROM pending p "
                "JOIN events e ON e.seq = p.seq GROUP BY p.sink"
            ).fetchall()
            return {sink: (count, oldest) for sink, count, oldest in rows}

        return await self._run(_depth)

    async def dead_letters(self, sink: str | None = None) -> list[DeadLetter]:
        def _list(db: sqlite3.Connection) -> list[DeadLetter]:
            query = (
                "SELECT d.sink, d.seq, e.id, e.type, d.reason, d.attempts, d.at "
                "FROM dead_letters d JOIN events e ON e.seq = d.seq"
            )
            args: tuple[str, ...] = ()
            if sink is not None:
                query += " WHERE d.sink = ?"
                args = (sink,)
            rows = db.execute(query + " ORDER BY d.seq", args).fetchall()
            return [DeadLetter(*row) for row in rows]

        return await self._run(_list)

    @staticmethod
    def _dead_letters_matching(
        db: sqlite3.Connection, sink: str | None, seqs: Sequence[int] | None
    ) -> list[tuple[str, int]]:
        """(sink, seq) of the dead letters a replay or purge applies to (None: all)."""
        rows = db.execute("SELECT sink, seq FROM dead_letters").fetchall()
        return [
            (s, q) for s, q in rows if (sink is None or s == sink) and (seqs is None or q in seqs)
        ]

    async def replay(self, sink: str | None = None, seqs: Sequence[int] | None = None) -> int:
        """Put dead letters back in their sink's queue; return how many."""

        def _replay(db: sqlite3.Connection) -> int:
            db.execute("PRAGMA synchronous=FULL")
            db.execute("BEGIN IMMEDIATE")
            chosen = self._dead_letters_matching(db, sink, seqs)
            for s, q in chosen:
                db.execute("INSERT OR IGNORE INTO pending (sink, seq) VALUES (?, ?)", (s, q))
                db.execute("DELETE FROM dead_letters WHERE sink = ? AND seq = ?", (s, q))
            db.execute("COMMIT")
            return len(chosen)

        return await self._run(_replay, write=True)

    async def purge(self, sink: str | None = None, seqs: Sequence[int] | None = None) -> int:
        """Delete dead letters for good; return how many."""

        def _purge(db: sqlite3.Connection) -> int:
            db.execute("PRAGMA synchronous=FULL")
            db.execute("BEGIN IMMEDIATE")
            chosen = self._dead_letters_matching(db, sink, seqs)
            db.executemany("DELETE FROM dead_letters WHERE sink = ? AND seq = ?", chosen)
            self._collect(db, [q for _, q in chosen])
            db.execute("COMMIT")
            return len(chosen)

        return await self._run(_purge, write=True)
