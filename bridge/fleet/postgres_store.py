"""The fleet store on PostgreSQL, for several fleet replicas sharing one state.

`[fleet.store] url = "postgresql://user@host:5432/fleet"` selects it (the `postgres`
extra installs psycopg 3; `bridge.fleet.service.build_store` imports this module only then).
Keep the password out of the file: libpq reads `PGPASSWORD` or a `PGPASSFILE`, or the whole
URL can come from `MAINTENANCE_BRIDGE__FLEET__STORE__URL`.

It is the SQLite store's logic on another connection: the same tables and statements
(`bridge.fleet.sql`), the same writer (`sqlite_store.apply`) and queries
(`sqlite_store.Reads`), through `_Qmark`, which rewrites their `?` placeholders to psycopg's
`%s`. As in the SQLite store, writes use one connection on one thread and reads another,
each with its own thread so a long ingest never blocks the API.

Why two replicas never double anything (the rules are in `bridge.fleet.store`): `ingest` is
one transaction at READ COMMITTED; the audit log's unique key (source, id) makes the second
replica's insert of an event wait for the first one's commit and then do nothing
(`ON CONFLICT DO NOTHING`, `rowcount` 0: counted as a duplicate, no state applied); the
notice and instance upserts are conditional (forward-only, min/max), so they commute. Two
replicas taking overlapping batches in different orders can deadlock; PostgreSQL then aborts
one transaction, which has written nothing, and `ingest` runs it again.

A connection that broke (server restart, network) raises `StoreError` for the call that met
it and is opened again by the next call, so a source's retry finds the store back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import errors as pgerrors

from bridge.fleet import sql, tallies
from bridge.fleet.sqlite_store import ReadQueries, apply
from bridge.fleet.store import (
    Batch,
    IngestResult,
    StoreError,
    UnstorableError,
)

T = TypeVar("T")
#: Seconds to wait for a connection before the call fails (and readiness says so).
CONNECT_TIMEOUT: Final = 10
#: Times `ingest` runs a batch that lost a deadlock or serialization conflict, at most.
CONFLICT_ATTEMPTS: Final = 5
#: Any constant: replicas starting together create the tables one at a time under it.
_SCHEMA_LOCK: Final = 0x6D62_666C_6565_7401


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

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self.connection = connection

    def execute(self, statement: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        statement = statement.replace(" LIKE ", " ILIKE ")
        return self.connection.execute(sql.to_pyformat(statement), _text_safe(params))

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
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleet-pg-r")
        self._connections: dict[str, psycopg.Connection[Any]] = {}
        self._open = False

    def __repr__(self) -> str:
        return f"PostgresStore({redacted(self.url)!r})"

    def _connect(self, role: str) -> _Qmark:
        """The connection of `role` (write or read), opened again if it broke."""
        if not self._open:
            raise StoreError("the fleet store is not open")
        connection = self._connections.get(role)
        if connection is None or connection.closed or connection.broken:
            if connection is not None:
                with contextlib.suppress(psycopg.Error):
                    connection.close()
            connection = psycopg.connect(
                self.url,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT,
                application_name=f"maintenance-bridge-fleet-{role}",
            )
            self._connections[role] = connection
        return _Qmark(connection)

    def _create_tables(self) -> None:
        db = self._connect("write")
        with db.connection.transaction():
            db.execute("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK,))
            for statement in sql.schema(sql.POSTGRES_SERIAL):
                db.execute(statement)
            db.execute(sql.ADD_ATTESTED)
            for statement in sql.READ_INDEXES:
                db.execute(statement)
            tallies.prepare(db, tallies.postgres_ddl(), tallies.POSTGRES_FILL_LOCK, postgres=True)

    def _check_tables(self) -> None:
        found = self._connect("read").execute("SELECT to_regclass('events')").fetchone()
        if found is None or found[0] is None:
            raise StoreError(
                f"no fleet store in {redacted(self.url)} (it has no events table; check "
                "[fleet.store] url)"
            )

    async def _run(self, executor: ThreadPoolExecutor, role: str, fn: Callable[[_Qmark], T]) -> T:
        def call() -> T:
            try:
                return fn(self._connect(role))
            except psycopg.DataError as exc:  # a value out of a column's range: not an outage
                raise UnstorableError(f"fleet store: {_reason(exc)}") from exc
            except psycopg.Error as exc:
                raise StoreError(f"fleet store {redacted(self.url)}: {_reason(exc)}") from exc

        return await asyncio.get_running_loop().run_in_executor(executor, call)

    def _read(self, fn: Callable[[_Qmark], T]) -> asyncio.Future[T]:
        return asyncio.ensure_future(self._run(self._reader, "read", fn))

    async def open(self) -> None:
        self._open = True  # `_connect` opens the connections on first use
        try:
            if self.read_only:
                await self._run(self._reader, "read", lambda _db: self._check_tables())
            else:
                await self._run(self._writer, "write", lambda _db: self._create_tables())
        except StoreError:
            await self.close()
            raise

    async def close(self) -> None:
        self._open = False
        loop = asyncio.get_running_loop()
        for role, executor in (("write", self._writer), ("read", self._reader)):
            connection = self._connections.pop(role, None)
            if connection is not None:
                await loop.run_in_executor(executor, connection.close)
        self._writer.shutdown(wait=True)
        self._reader.shutdown(wait=True)

    async def ping(self) -> None:
        def probe(db: _Qmark) -> None:
            with db.connection.transaction():
                db.execute(sql.PROBE, (time.time(),))

        await self._read(lambda db: db.execute("SELECT 1").fetchone())
        await self._run(self._writer, "write", probe)

    async def ingest(self, batch: Batch) -> IngestResult:
        (result,) = await self.ingest_many([batch])
        return result

    async def ingest_many(self, batches: Sequence[Batch]) -> list[IngestResult]:
        def write(db: _Qmark) -> list[IngestResult]:
            for attempt in range(1, CONFLICT_ATTEMPTS + 1):
                try:
                    with db.connection.transaction():
                        return [apply(db, batch) for batch in batches]
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


def _reason(exc: psycopg.Error) -> str:
    """The server's or libpq's message, on one line (never the connection string)."""
    return " ".join(str(exc).split()) or type(exc).__name__
