"""The default fleet store: one SQLite file in the state directory (embedded, no set-up).

Writes go through one connection on one thread (`ingest` is one `BEGIN IMMEDIATE`
transaction per batch, `synchronous=FULL`: a 2xx or an ack follows a durable commit); reads
use a second connection on their own thread, which WAL lets run beside a write, so the API
stays responsive while a backlog is ingested. The rules are in `bridge.fleet.store`; what
this file holds is the connections and threads: the SQL both stores share is in
`bridge.fleet.writes` (a batch into the tables) and `bridge.fleet.reads` (the queries), the
statements in `bridge.fleet.sql`, the schema's versions in `bridge.fleet.migrations`.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, TypeVar

from bridge.fleet import migrations, sql, writes
from bridge.fleet.reads import ReadQueries
from bridge.fleet.store import Batch, IngestResult, StoreError, UnstorableError
from bridge.infra.backoff import retry_for

T = TypeVar("T")


#: How long a write (and the switch to WAL) waits for another connection's lock.
BUSY_TIMEOUT_S: Final = 10
#: The write-ahead log's pages after which the writer checkpoints it itself (SQLite's
#: automatic checkpoint, in the commit that crosses it): only when the checkpointer thread
#: fell behind (`CHECKPOINT_EVERY_S`), since a checkpoint that runs to the end is what lets
#: the next write start the log over; about 40 MiB.
WRITER_CHECKPOINT_PAGES: Final = 10_000
#: The checkpointer thread copies the log into the database at most this often, while
#: writes come: off the writer's turn (a passive checkpoint runs beside writes), where
#: SQLite's automatic checkpoint (every 1,000 pages, by the writer, inside its commit) was
#: about a third of a heartbeat's commit. Every 50 ms cost the checkpointer 11 to 19 us
#: per event at a few thousand events/s (a page rewritten by many commits is copied once
#: per pass, and each pass syncs the database file); every 200 ms, 7 to 9.
CHECKPOINT_EVERY_S: Final = 0.2


def _wal(db: sqlite3.Connection) -> None:
    """Switch the file to WAL. The switch takes the file's exclusive lock and SQLite does not
    wait for it (`busy_timeout` does not apply), so replicas opening a new file at once
    would fail with "database is locked": the switch is retried for as long as a busy
    write would wait (the project's one backoff policy, from 10 ms up to 100 ms apart)."""
    retry_for(
        lambda: db.execute("PRAGMA journal_mode=WAL"),
        seconds=BUSY_TIMEOUT_S,
        retry_on=sqlite3.OperationalError,
        when=lambda exc: "locked" in str(exc),
        initial=0.01,
        maximum=0.1,
    )


class SqliteStore(ReadQueries):
    """`bridge.fleet.store.Store` on a SQLite file (see the module docstring)."""

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path = path
        #: `fleet status` and `export`: open an existing store for reading, never create one.
        self.read_only = read_only
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleet-store-w")
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleet-store-r")
        self._write_db: sqlite3.Connection | None = None
        self._read_db: sqlite3.Connection | None = None
        self._checkpointer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleet-store-c")
        self._checkpoint_db: sqlite3.Connection | None = None
        # The writer's commits, whether the checkpointer is at work, when its last pass began.
        self._checkpoint_lock = threading.Lock()
        self._commits = 0
        self._checkpointing = False
        self._checkpoint_at = 0.0

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_S * 1000}")
        return db

    def _open(self) -> None:
        if self.read_only:
            self._open_read_only()
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = self._connect()
            _wal(db)
            db.execute("PRAGMA synchronous=FULL")
            migrations.upgrade(db, migrations.SQLITE, f"at {self.path}")
            db.execute(f"PRAGMA wal_autocheckpoint={WRITER_CHECKPOINT_PAGES}")
            self._write_db = db
            self._read_db = self._connect()
            self._checkpoint_db = self._connect()
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the fleet store at {self.path}: {exc}") from exc

    def _open_read_only(self) -> None:
        """A `mode=ro` connection to a file that must exist and hold the fleet's tables: a
        mistyped path is an error naming it, never a new empty store (nor its directories)."""
        if not self.path.is_file():
            raise StoreError(f"no fleet store at {self.path} (check [fleet.store] url)")
        try:
            db = sqlite3.connect(
                f"{self.path.absolute().as_uri()}?mode=ro",
                uri=True,
                isolation_level=None,
                check_same_thread=False,
            )
            db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_S * 1000}")
            found = db.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'events'"
            ).fetchone()[0]
            if found:
                migrations.check(db, migrations.SQLITE, f"at {self.path}")
        except sqlite3.Error as exc:
            db.close()
            raise StoreError(f"cannot read the fleet store at {self.path}: {exc}") from exc
        except StoreError:
            db.close()
            raise
        if not found:
            db.close()
            raise StoreError(f"{self.path} is not a fleet store (it has no events table)")
        self._read_db = db

    async def _run(
        self, executor: ThreadPoolExecutor, fn: Callable[[sqlite3.Connection], T], write: bool
    ) -> T:
        def call() -> T:
            db = self._write_db if write else self._read_db
            if db is None:
                raise StoreError("the fleet store is not open")
            try:
                return fn(db)
            except Exception as exc:
                # Whatever failed (the database, or a value it cannot bind), the transaction
                # ends here: left open, it would make every later ingest fail.
                with contextlib.suppress(sqlite3.Error):  # a closed connection cannot roll back
                    if db.in_transaction:
                        db.rollback()
                if isinstance(exc, sqlite3.DataError | OverflowError):
                    raise UnstorableError(f"fleet store {self.path}: {exc}") from exc
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(f"fleet store {self.path}: {exc}") from exc
                raise

        return await asyncio.get_running_loop().run_in_executor(executor, call)

    def _committed(self) -> None:
        """After a write's commit (in the writer thread): the checkpointer is handed the
        log, unless it is at work already (it looks again once done)."""
        with self._checkpoint_lock:
            self._commits += 1
            if self._checkpointing:
                return
            self._checkpointing = True
        self._checkpointer.submit(self._checkpoint)

    def _checkpoint(self) -> None:
        """Copy the log's committed pages into the database beside the writes (a passive
        checkpoint takes no lock a writer or reader waits for), at most every
        `CHECKPOINT_EVERY_S`, until a pass began after the last commit. A failure is the
        next pass's to retry; the writer's own checkpoint bounds the log meanwhile."""
        while True:
            pause = self._checkpoint_at + CHECKPOINT_EVERY_S - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # this thread's own: writes and reads go on
            with self._checkpoint_lock:
                seen = self._commits
            self._checkpoint_at = time.monotonic()
            db = self._checkpoint_db
            if db is not None:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            with self._checkpoint_lock:
                if db is None or self._commits == seen:
                    self._checkpointing = False
                    return

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        return asyncio.ensure_future(self._run(self._reader, fn, write=False))

    async def open(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._writer, self._open)

    async def close(self) -> None:
        for db, executor in (
            (self._write_db, self._writer),
            (self._read_db, self._reader),
            (self._checkpoint_db, self._checkpointer),
        ):
            if db is not None:
                await asyncio.get_running_loop().run_in_executor(executor, db.close)
        self._write_db = self._read_db = self._checkpoint_db = None
        self._writer.shutdown(wait=True)
        self._reader.shutdown(wait=True)
        self._checkpointer.shutdown(wait=True)

    async def ping(self) -> None:
        def probe(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            db.execute(sql.PROBE, (datetime.now(UTC).timestamp(),))
            db.execute("COMMIT")
            self._committed()

        await self._read(lambda db: db.execute("SELECT 1").fetchone())
        await self._run(self._writer, probe, write=True)

    dialect: Final = migrations.SQLITE.name

    async def ingest(self, batch: Batch) -> IngestResult:
        (result,) = await self.ingest_many([batch])
        return result

    async def ingest_many(self, batches: Sequence[Batch]) -> list[IngestResult]:
        # The rows are composed here, on the caller's loop: the writer thread's turn is
        # every write's, so it only runs the statements.
        planned = writes.plan(batches)

        def write(db: sqlite3.Connection) -> list[IngestResult]:
            db.execute("BEGIN IMMEDIATE")
            results = writes.write(db, planned)
            db.execute("COMMIT")
            self._committed()
            return results

        return await self._run(self._writer, write, write=True)

    async def transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def write(db: sqlite3.Connection) -> T:
            db.execute("BEGIN IMMEDIATE")
            result = fn(db)
            db.execute("COMMIT")
            self._committed()
            return result

        return await self._run(self._writer, write, write=True)
