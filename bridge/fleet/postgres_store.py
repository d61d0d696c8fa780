"""The fleet store on PostgreSQL, for several fleet replicas sharing one state.

`[fleet.store] url = "postgresql://user@host:5432/fleet"` selects it (the `postgres`
extra installs psycopg 3; `bridge.fleet.service.build_store` imports this module only then).
Keep the password out of the file: libpq reads `PGPASSWORD` or a `PGPASSFILE`, or the whole
URL can come from `MAINTENANCE_BRIDGE__FLEET__STORE__URL`.

It is the SQLite store's logic on another connection: the same statements
(`bridge.fleet.sql`), the same writer (`bridge.fleet.writes`) and queries
(`bridge.fleet.reads`), through `_Qmark`, which rewrites their `?` placeholders to psycopg's
`%s`. What differs is the audit log, partitioned by month with its own de-duplication table
(`bridge.fleet.partitions`: events go in as one multi-row statement per batch), and the
schema's later steps (`bridge.fleet.migrations`), run at open on a connection of their own.

Connections come from a pool (`psycopg_pool`): the writer's one thread and `READERS` read
threads each take one per call, so reads run beside each other and beside a long ingest.
psycopg prepares a statement from its second execution on a connection
(`PREPARE_THRESHOLD`), so the server plans ingest's statements and the read queries once
per connection instead of per call.

Why two replicas never double anything (the rules are in `bridge.fleet.store`): `ingest` is
one transaction at READ COMMITTED; the primary key (source, id) of `event_keys` makes the
second replica's insert of an event's key wait for the first one's commit and then do nothing
(`ON CONFLICT DO NOTHING`: not returned, counted as a duplicate, no state applied); the
notice and instance upserts are conditional (forward-only, min/max), so they commute. Two
replicas taking overlapping batches in different orders can deadlock; PostgreSQL then aborts
one transaction, which has written nothing, and `ingest` runs it again.

A connection that broke (server restart, network) raises `StoreError` for the call that met
it; the pool drops it and opens another, so a source's retry finds the store back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import errors as pgerrors
from psycopg_pool import ConnectionPool

from bridge.fleet import migrations, partitions, sql, tallies, writes
from bridge.fleet.reads import ReadQueries
from bridge.fleet.store import (
    Batch,
    IngestResult,
    StoreError,
    UnstorableError,
)
from bridge.fleet.writes import EventRow, InstanceRow

T = TypeVar("T")
log = logging.getLogger("bridge.fleet.store")
#: Seconds to wait for a connection before the call fails (and readiness says so).
CONNECT_TIMEOUT: Final = 10
#: Threads (and pooled connections) serving reads at once; the writer has one more.
READERS: Final = 4
#: Executions of a statement before psycopg prepares it on that connection: from the second
#: on, the server reuses its plan (ingest's statements and the read queries have fixed text;
#: one-off schema statements are never prepared).
PREPARE_THRESHOLD: Final = 1
#: Times `ingest` runs a batch that lost a deadlock or serialization conflict, at most.
CONFLICT_ATTEMPTS: Final = 5


def redacted(url: str) -> str:
    """`url` without its password, for logs and `repr`."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    netloc = f"{parts.username or ''}:***@{host}"
    return urlunsplit(parts._replace(netloc=netloc))


class _Qmark:
    """A psycopg connection that takes the `?` statements of `bridge.fleet.sql` and the
    shared queries. PostgreSQL's TEXT cannot hold NUL, which only a refused (not JSON, or
    not UTF-8) body can carry: it is stored as U+FFFD, like the other undecodable bytes.
    LIKE becomes ILIKE: the shared searches ignore case, as SQLite's LIKE does (ASCII)."""

    #: For the few queries that differ (`bridge.fleet.reads`: SQLite's index hints).
    postgres: Final = True

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self.connection = connection

    def execute(self, statement: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        statement = statement.replace(" LIKE ", " ILIKE ")
        values = _text_safe(params)
        if any(isinstance(value, list) for value in values):
            # Arrays (the multi-row writes) go in binary: psycopg's text format escapes each
            # element with a regular expression in Python, most of a batch's cost.
            binary = statement.replace("%", "%%").replace("?", "%b")
            return self.connection.execute(binary, values)
        return self.connection.execute(sql.to_pyformat(statement), values)

    def executemany(self, statement: str, rows: Iterable[Sequence[Any]]) -> None:
        values = [_text_safe(row) for row in rows]
        if values:
            with self.connection.cursor() as cursor:
                cursor.executemany(sql.to_pyformat(statement), values)


def _text_safe(params: Sequence[Any]) -> list[Any]:
    return [v.replace("\x00", "\ufffd") if isinstance(v, str) else v for v in params]


class PostgresStore(ReadQueries):
    """`bridge.fleet.store.Store` on a PostgreSQL database (see the module docstring)."""

    def __init__(self, url: str, *, read_only: bool = False) -> None:
        self.url = url
        #: `fleet status` and `export`: check the tables are there, never create them.
        self.read_only = read_only
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleet-pg-w")
        self._reader = ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="fleet-pg-r")
        self._pool: ConnectionPool[psycopg.Connection[Any]] | None = None

    def __repr__(self) -> str:
        return f"PostgresStore({redacted(self.url)!r})"

    def _direct(self) -> psycopg.Connection[Any]:
        """A connection of its own (schema changes): libpq's own error if it cannot."""
        return psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT,
            application_name="maintenance-bridge-fleet-schema",
        )

    def _open_pool(self) -> None:
        """Upgrade the schema (or check it, read-only) on a connection of its own, then
        start the pool the writer and the readers share."""
        with self._direct() as connection:
            db = _Qmark(connection)
            where = f"in {redacted(self.url)}"
            if self.read_only:
                found = db.execute("SELECT to_regclass('events')").fetchone()
                if found is None or found[0] is None:
                    raise StoreError(
                        f"no fleet store {where} (it has no events table; check [fleet.store] url)"
                    )
                migrations.check(db, migrations.POSTGRES, where)
            else:
                migrations.upgrade(db, migrations.POSTGRES, where)
                try:
                    with connection.transaction():
                        partitions.ensure_months(db, [time.time()])
                except pgerrors.LockNotAvailable as exc:  # a long read; retention retries
                    log.warning("fleet store: partitions not made at start: %s", _reason(exc))
        pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            self.url,
            min_size=2,
            max_size=READERS + 1,
            timeout=CONNECT_TIMEOUT,
            open=False,
            name="fleet",
            kwargs={
                "autocommit": True,
                "connect_timeout": CONNECT_TIMEOUT,
                "prepare_threshold": PREPARE_THRESHOLD,
                "application_name": "maintenance-bridge-fleet",
            },
        )
        pool.open(wait=False)
        self._pool = pool

    async def _run(self, executor: ThreadPoolExecutor, role: str, fn: Callable[[_Qmark], T]) -> T:
        """`fn` on a pooled connection in `executor` (the writer's one thread, or the
        readers'); a connection found broken is dropped by the pool on its return, so the
        next call gets a new one."""

        def call() -> T:
            pool = self._pool
            if pool is None:
                raise StoreError("the fleet store is not open")
            try:
                with pool.connection() as connection:
                    return fn(_Qmark(connection))
            except psycopg.DataError as exc:  # a value out of a column's range: not an outage
                raise UnstorableError(f"fleet store: {_reason(exc)}") from exc
            except psycopg.Error as exc:
                raise StoreError(f"fleet store {redacted(self.url)}: {_reason(exc)}") from exc

        return await asyncio.get_running_loop().run_in_executor(executor, call)

    def _read(self, fn: Callable[[_Qmark], T]) -> asyncio.Future[T]:
        return asyncio.ensure_future(self._run(self._reader, "read", fn))

    async def open(self) -> None:
        def start() -> None:
            try:
                self._open_pool()
            except psycopg.Error as exc:
                raise StoreError(f"fleet store {redacted(self.url)}: {_reason(exc)}") from exc

        try:
            await asyncio.get_running_loop().run_in_executor(self._writer, start)
        except StoreError:
            await self.close()
            raise

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.get_running_loop().run_in_executor(self._writer, pool.close)
        self._writer.shutdown(wait=True)
        self._reader.shutdown(wait=True)

    async def ping(self) -> None:
        def probe(db: _Qmark) -> None:
            with db.connection.transaction():
                db.execute(sql.PROBE, (time.time(),))

        await self._read(lambda db: db.execute("SELECT 1").fetchone())
        await self._run(self._writer, "write", probe)

    dialect: Final = migrations.POSTGRES.name

    async def ingest(self, batch: Batch) -> IngestResult:
        (result,) = await self.ingest_many([batch])
        return result

    async def ingest_many(self, batches: Sequence[Batch]) -> list[IngestResult]:
        # The rows are composed here, on the caller's loop: the writer thread's turn is
        # every write's, so it only runs the statements.
        planned = writes.plan(batches)

        def write(db: _Qmark) -> list[IngestResult]:
            for attempt in range(1, CONFLICT_ATTEMPTS + 1):
                try:
                    with db.connection.transaction():
                        return writes.write(db, planned, WRITER)
                except (pgerrors.DeadlockDetected, pgerrors.SerializationFailure):
                    if attempt == CONFLICT_ATTEMPTS:
                        raise
            raise AssertionError("unreachable")

        return await self._run(self._writer, "write", write)

    async def transaction(self, fn: Callable[[Any], T]) -> T:
        def write(db: _Qmark) -> T:
            with db.connection.transaction():
                return fn(db)

        return await self._run(self._writer, "write", write)


def _columns(rows: Sequence[Sequence[Any]]) -> list[list[Any]]:
    """`rows` as one list per column, text made safe for PostgreSQL (`_Qmark`)."""
    return [list(column) for column in zip(*(_text_safe(row) for row in rows), strict=True)]


class _Writer:
    """Each table's rows of a transaction in ONE statement over arrays (`unnest`): a group
    of hundreds of posts is a handful of statements, each prepared once per connection,
    rather than a round of executions per row (`bridge.fleet.writes`)."""

    def insert_events(self, db: _Qmark, rows: list[EventRow]) -> set[tuple[str, str]]:
        return partitions.insert_events(db, [_text_safe(row) for row in rows])

    def upsert_instances(self, db: _Qmark, rows: list[InstanceRow]) -> None:
        # One row per instance (`apply_many`): ON CONFLICT cannot change a row twice. The
        # heartbeats' rows are read (and locked) first: the one upsert writes their new
        # silent moments and groups, so `silent_moves` needs the old ones.
        beating = [row for row in rows if row[14] is not None]
        held = db.execute(_HELD, ([row[0] for row in beating],)).fetchall() if beating else []
        db.execute(_UPSERT_INSTANCES, _columns(rows))
        moves = tallies.silent_moves(held, beating, regroup=True)
        if moves:
            keys = list(moves)
            db.execute(_SILENT_MOVES, [*_columns(keys), list(moves.values())])
            emptied = [key for key in keys if moves[key] < 0]
            if emptied:
                db.execute(_SILENT_EMPTIED, _columns(emptied))

    def upsert_notices(self, db: _Qmark, rows: list[tuple[Any, ...]]) -> None:
        # One row per notice (`apply_many`): ON CONFLICT cannot change a row twice.
        db.execute(_UPSERT_NOTICES, _columns(rows))


WRITER: Final = _Writer()
_UPSERT_INSTANCES: Final = (
    f"INSERT INTO instances ({sql.INSTANCE_HEARTBEAT_COLUMNS}) SELECT * FROM unnest("  # noqa: S608
    + "?::text[], " * 11
    + "?::float8[], ?::float8[], ?::int[], "
    + "?::float8[], ?::float8[], ?::text[], ?::int[], ?::bigint[], ?::float8[]) "
    + sql.INSTANCE_CONFLICT
)
#: The heartbeats' instances as they are before the upsert, locked as the upsert would
#: lock them (it updates no key), so no other replica changes them before it.
_HELD: Final = (
    f"SELECT {tallies.HELD_COLUMNS} FROM instances "  # noqa: S608
    "WHERE source = ANY(?::text[]) FOR NO KEY UPDATE"
)
_SILENT_MOVES: Final = (
    "INSERT INTO silent_tallies (minute, provider, version, zone, n) SELECT * FROM "
    "unnest(?::bigint[], ?::text[], ?::text[], ?::text[], ?::bigint[]) "
    "ON CONFLICT (minute, provider, version, zone) DO UPDATE SET n = silent_tallies.n + excluded.n"
)
_SILENT_EMPTIED: Final = (
    "DELETE FROM silent_tallies t USING unnest(?::bigint[], ?::text[], ?::text[], ?::text[]) "
    "AS k(m, p, v, z) WHERE t.minute = k.m AND t.provider = k.p AND t.version = k.v "
    "AND t.zone = k.z AND t.n = 0"
)
_UPSERT_NOTICES: Final = (
    f"INSERT INTO notices ({sql.NOTICE_COLUMNS}) SELECT * FROM unnest("  # noqa: S608
    + "?::text[], " * 7
    + f"?::int[], ?::float8[], ?::float8[], ?::text[], ?::text[]) {sql.NOTICE_CONFLICT}"
)


def _reason(exc: psycopg.Error) -> str:
    """The server's or libpq's message, on one line (never the connection string)."""
    return " ".join(str(exc).split()) or type(exc).__name__
