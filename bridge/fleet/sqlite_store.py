"""The default fleet store: one SQLite file in the state directory (embedded, no set-up).

Writes go through one connection on one thread (`ingest` is one `BEGIN IMMEDIATE`
transaction per batch, `synchronous=FULL`: a 2xx or an ack follows a durable commit); reads
use a second connection on their own thread, which WAL lets run beside a write, so the API
stays responsive while a backlog is ingested. The rules are in `bridge.fleet.store`, the
SQL in `bridge.fleet.sql`.

`apply` (the write side) and `Reads` (the queries) are plain SQL over any object with
`execute(sql, params)` returning a cursor (`rowcount`, `fetchall`, `fetchone`,
`description`) and `executemany(sql, rows)`, with `?` placeholders: a PostgreSQL store
reuses both by wrapping its connection in an adapter that rewrites them with
`bridge.fleet.sql.to_pyformat`, and runs `apply` inside its own transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec

from bridge import contract
from bridge.fleet import migrations, sql
from bridge.fleet.state import FINISHED_RANK, RANK, zone_of
from bridge.fleet.store import (
    Accepted,
    Batch,
    EventPage,
    EventQuery,
    IngestResult,
    NoticeFilter,
    StoreError,
)

T = TypeVar("T")
DEFAULT_FILE: Final = "fleet.sqlite3"
_JSON: Final = msgspec.json.Decoder(dict[str, Any])


class _WindowOnly(msgspec.Struct):
    window: dict[str, Any] | None = None


class _DataWindow(msgspec.Struct):
    """What a notice listing reads of the current event: its window (the rest stays raw)."""

    data: _WindowOnly


_WINDOW: Final = msgspec.json.Decoder(_DataWindow)
_AUDIT_TYPES: Final = (contract.APPROVED, contract.HOOK_COMPLETED)
# Query heads; `_where` appends fixed clauses whose values are parameters.
_NOTICES: Final = (
    "SELECT n.source, n.notice_id, n.provider, n.instance, n.zone, n.kind, n.status, "
    "n.time, n.not_before, n.event_id, n.body FROM notices n"
)
# Only the audit events' bodies are read (approvals, hook outcomes); not the transitions'.
_HISTORY: Final = (
    "SELECT e.source, e.notice_id, e.type, e.id, e.time, "  # noqa: S608 (constants only)
    f"CASE WHEN e.type IN ('{contract.APPROVED}', '{contract.HOOK_COMPLETED}') "
    "THEN e.body END, e.seq FROM events e "
    "JOIN notices n ON e.source = n.source AND e.notice_id = n.notice_id"
)
_INSTANCES: Final = (
    "SELECT source, provider, name, instance_id, zone, location, project, subscription, "
    "resource_group, scale_set, resource_id, first_seen, last_seen, last_heartbeat, "
    "heartbeat_interval, agent_version, watcher_healthy, spool_depth, started_at, "
    "retired_at FROM instances"
)
_EVENTS: Final = "SELECT seq, ingest, received_at, body FROM events"


def _epoch(value: Any) -> float:
    return float(value.timestamp())


def _rfc3339(value: float | None) -> str | None:
    if value is None:
        return None
    return contract.rfc3339(datetime.fromtimestamp(value, UTC))


def _notice_id(event: contract.Event) -> str | None:
    data = event.data
    if isinstance(data, contract.MaintenanceData | contract.TriggerData):
        return data.notice_id
    return None


#: How `apply` appends a batch's events to the audit log: (db, batch, items) -> the
#: (source, id) of those that were new (PostgreSQL's partitioned log has its own).
EventWriter = Callable[[Any, Batch, list[Accepted]], set[tuple[str, str]]]


def apply(db: Any, batch: Batch, insert_events: EventWriter | None = None) -> IngestResult:
    """Write `batch` with `db` inside the caller's transaction (any DB-API connection whose
    placeholders are `?`). Returns what was new, known, refused.

    Only the events the audit log did not have yet change the state, each once: one
    instance upsert per VM of the batch, then the heartbeats and notices in batch order (the
    notice upsert's forward-only rule makes that order irrelevant anyway).
    """
    items = list(batch.accepted)
    inserted = (insert_events or _insert_events)(db, batch, items)
    applied: set[tuple[str, str]] = set()
    lags: list[float] = []
    instances: dict[str, list[Any]] = {}
    heartbeats: list[tuple[Any, ...]] = []
    notices: list[tuple[Any, ...]] = []
    for item in items:
        event = item.event
        key = (event.source, event.id)
        if key not in inserted or key in applied:
            continue
        applied.add(key)
        time = _epoch(event.time)
        lags.append(batch.received_at - time)
        _merge_instance(instances, event, time)
        data = event.data
        if isinstance(data, contract.HeartbeatData):
            heartbeats.append(
                (
                    time,
                    data.interval_seconds,
                    data.agent_version,
                    int(data.watcher_healthy),
                    data.spool_depth,
                    _epoch(data.started_at),
                    event.source,
                    time,
                )
            )
        elif isinstance(data, contract.MaintenanceData):
            notices.append(
                (
                    event.source,
                    data.notice_id,
                    data.provider,
                    event.instance.name,
                    zone_of(event.instance.zone, event.instance.location),
                    data.kind,
                    data.status,
                    RANK[data.status],
                    time,
                    _epoch(data.not_before) if data.not_before else None,
                    event.id,
                    item.body.decode(),
                )
            )
    db.executemany(sql.UPSERT_INSTANCE, [tuple(row) for row in instances.values()])
    db.executemany(sql.UPDATE_HEARTBEAT, heartbeats)
    db.executemany(sql.UPSERT_NOTICE, notices)
    db.executemany(
        sql.INSERT_REJECTED,
        [
            (batch.ingest, batch.received_at, r.reason, r.body.decode("utf-8", "replace"))
            for r in batch.refused
        ],
    )
    db.executemany(
        sql.UPSERT_CHECKPOINT,
        [(batch.ingest, part, pos, batch.received_at) for part, pos in batch.checkpoints.items()],
    )
    return IngestResult(len(applied), len(items) - len(applied), len(batch.refused), tuple(lags))


def _insert_events(db: Any, batch: Batch, items: list[Accepted]) -> set[tuple[str, str]]:
    """Append `items` to the audit log; the (source, id) of those that were new.

    One statement per event: measured faster in SQLite than a multi-row INSERT ... RETURNING.
    """
    inserted: set[tuple[str, str]] = set()
    for item in items:
        source, id_, type_, instance, notice, time, body = event_row(item)
        cursor = db.execute(
            sql.INSERT_EVENT,
            (source, id_, type_, instance, notice, time, batch.received_at, batch.ingest, body),
        )
        if cursor.rowcount == 1:
            inserted.add((source, id_))
    return inserted


def event_row(item: Accepted) -> tuple[str, str, str, str, str | None, float, str]:
    """The audit log's columns of one event: source, id, type, instance, notice_id, time,
    body (the receive time and the ingest are the batch's)."""
    event = item.event
    return (
        event.source,
        event.id,
        event.type,
        event.instance.name,
        _notice_id(event),
        _epoch(event.time),
        item.body.decode(),
    )


def _merge_instance(instances: dict[str, list[Any]], event: contract.Event, time: float) -> None:
    """One instance row per source and batch: the earliest and latest event time, the
    identity of the latest event."""
    instance = event.instance
    row = instances.get(event.source)
    identity = [
        event.source,
        event.provider or "unknown",
        instance.name,
        instance.id,
        zone_of(instance.zone, instance.location),
        instance.location,
        instance.project,
        instance.subscription,
        instance.resource_group,
        instance.scale_set,
        instance.resource_id,
    ]
    if row is None:
        instances[event.source] = [*identity, time, time]
        return
    first, last = row[11], row[12]
    if time >= last:
        row[:11] = identity
    row[11], row[12] = min(first, time), max(last, time)


def _where(conditions: Iterable[tuple[str, Any]]) -> tuple[str, list[Any]]:
    """A WHERE clause of the fixed `clauses` whose value is not None; the values become
    parameters (one per `?`), never SQL text."""
    clauses, params = [], []
    for clause, value in conditions:
        if value is None:
            continue
        clauses.append(clause)
        params.extend([value] * clause.count("?"))
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


class Reads:
    """The store's queries over a DB-API connection with `?` placeholders."""

    @staticmethod
    def notices(db: Any, where: NoticeFilter, in_force: bool) -> list[dict[str, Any]]:
        clause, params = _where(
            [
                (f"n.rank < {FINISHED_RANK}", True if in_force else None),
                ("n.provider = ?", where.provider),
                ("n.zone = ?", where.zone),
                ("n.kind = ?", where.kind),
                ("n.status = ?", where.status),
                ("(n.instance = ? OR n.source = ?)", where.instance),
            ]
        )
        query = f"{_NOTICES}{clause} ORDER BY n.not_before IS NULL, n.not_before, n.time"
        rows = db.execute(query, params).fetchall()
        notices: dict[tuple[str, str], dict[str, Any]] = {}
        for source, notice_id, provider, name, zone, kind, status, time, nb, eid, body in rows:
            window = _WINDOW.decode(body).data.window
            notices[(source, notice_id)] = {
                "source": source,
                "instance": name,
                "notice_id": notice_id,
                "provider": provider,
                "zone": zone,
                "kind": kind,
                "status": status,
                "not_before": _rfc3339(nb),
                "window": window,
                "updated": _rfc3339(time),
                "event_id": eid,
                "event": msgspec.Raw(body.encode()),  # as received, not re-encoded
                "transitions": [],
                "approvals": [],
                "hooks": [],
            }
        if not notices:
            return []
        # Ordered here, not in SQL: an ORDER BY on events lets the planner walk the whole
        # audit log by time instead of the few notices' histories by index.
        history = sorted(
            db.execute(f"{_HISTORY}{clause}", params).fetchall(), key=lambda r: (r[4], r[6])
        )
        for source, notice_id, type_, event_id, time, body, _seq in history:
            notice = notices.get((source, notice_id))
            if notice is None:
                continue
            if type_ in contract.MAINTENANCE_TYPES:
                status = type_.removeprefix(contract.TYPE_PREFIX)
                notice["transitions"].append(
                    {"status": status, "event_id": event_id, "time": _rfc3339(time)}
                )
            elif type_ in _AUDIT_TYPES:
                data = _JSON.decode(body)["data"]
                entry = {
                    **data,
                    "event_id": event_id,
                    "time": _rfc3339(time),
                    "trigger_event_id": data.get("event_id"),
                }
                for key in ("instance", "provider", "notice_id"):
                    entry.pop(key, None)
                kind = "approvals" if type_ == contract.APPROVED else "hooks"
                notice[kind].append(entry)
        return list(notices.values())

    @staticmethod
    def instances(db: Any, keys: Sequence[str] | None) -> list[dict[str, Any]]:
        if keys is None:
            cursor = db.execute(f"{_INSTANCES} ORDER BY name, source")
        else:
            marks = ", ".join("?" * len(keys))
            cursor = db.execute(
                f"{_INSTANCES} WHERE name IN ({marks}) OR source IN ({marks}) "
                "ORDER BY name, source",
                [*keys, *keys],
            )
        names = [column[0] for column in cursor.description]
        result = []
        for row in cursor.fetchall():
            item = dict(zip(names, row, strict=True))
            if item["watcher_healthy"] is not None:
                item["watcher_healthy"] = bool(item["watcher_healthy"])
            result.append(item)
        return result

    @staticmethod
    def events(db: Any, query: EventQuery) -> EventPage:
        clause, params = _where(
            [
                ("seq > ?", query.cursor),
                ("(instance = ? OR source = ?)", query.instance),
                ("type = ?", query.type),
                ("time >= ?", query.since),
                ("time < ?", query.until),
            ]
        )
        statement = f"{_EVENTS}{clause} ORDER BY seq LIMIT ?"
        rows = db.execute(statement, [*params, query.limit + 1]).fetchall()
        more = len(rows) > query.limit
        page = [(int(s), str(i), float(r), str(b).encode()) for s, i, r, b in rows[: query.limit]]
        return EventPage(page, page[-1][0] if more and page else None)

    @staticmethod
    def rejected(db: Any, limit: int) -> list[dict[str, Any]]:
        rows = db.execute(
            "SELECT seq, ingest, received_at, reason, body FROM rejected ORDER BY seq DESC LIMIT ?",
            (limit,),
        ).fetchall()
        return [
            {"seq": s, "ingest": i, "received_at": _rfc3339(r), "reason": why, "body": b}
            for s, i, r, why, b in rows
        ]

    @staticmethod
    def notice_counts(db: Any) -> list[tuple[str, str | None, str, str, int]]:
        rows = db.execute(
            "SELECT provider, zone, kind, status, COUNT(*) FROM notices WHERE rank < 2 "
            "GROUP BY provider, zone, kind, status ORDER BY provider, zone, kind, status"
        ).fetchall()
        return [(str(p), z, str(k), str(s), int(n)) for p, z, k, s, n in rows]

    @staticmethod
    def counts(db: Any) -> dict[str, int]:
        counts = {}
        for name, query in (
            ("events", "SELECT COUNT(*) FROM events"),
            ("instances", "SELECT COUNT(*) FROM instances"),
            ("notices", "SELECT COUNT(*) FROM notices"),
            ("notices_in_force", "SELECT COUNT(*) FROM notices WHERE rank < 2"),
            ("rejected", "SELECT COUNT(*) FROM rejected"),
        ):
            (counts[name],) = db.execute(query).fetchone()
        return counts

    @staticmethod
    def checkpoints(db: Any, ingest: str) -> dict[str, str]:
        rows = db.execute(
            "SELECT part, position FROM checkpoints WHERE ingest = ?", (ingest,)
        ).fetchall()
        return {str(part): str(position) for part, position in rows}


class ReadQueries:
    """The store's read methods, one per `Reads` query, each run through the backend's own
    `_read` (its reader thread and connection): every SQL backend shares them, since the
    queries are the same SQL (`?` placeholders; PostgreSQL adapts them)."""

    def _read(self, fn: Callable[[Any], T]) -> Awaitable[T]:
        raise NotImplementedError

    async def checkpoints(self, ingest: str) -> dict[str, str]:
        return await self._read(lambda db: Reads.checkpoints(db, ingest))

    async def notices(self, where: NoticeFilter, *, in_force: bool = True) -> list[dict[str, Any]]:
        return await self._read(lambda db: Reads.notices(db, where, in_force))

    async def instances(self, keys: Sequence[str] | None = None) -> list[dict[str, Any]]:
        return await self._read(lambda db: Reads.instances(db, keys))

    async def events(self, query: EventQuery) -> EventPage:
        return await self._read(lambda db: Reads.events(db, query))

    async def rejected(self, limit: int = 100) -> list[dict[str, Any]]:
        return await self._read(lambda db: Reads.rejected(db, limit))

    async def notice_counts(self) -> list[tuple[str, str | None, str, str, int]]:
        return await self._read(Reads.notice_counts)

    async def counts(self) -> dict[str, int]:
        return await self._read(Reads.counts)


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

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA busy_timeout=10000")
        return db

    def _open(self) -> None:
        if self.read_only:
            self._open_read_only()
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = self._connect()
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            migrations.upgrade(db, migrations.SQLITE, f"at {self.path}")
            self._write_db = db
            self._read_db = self._connect()
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
            db.execute("PRAGMA busy_timeout=10000")
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
            except sqlite3.Error as exc:
                with contextlib.suppress(sqlite3.Error):  # a closed connection cannot roll back
                    if db.in_transaction:
                        db.rollback()
                raise StoreError(f"fleet store {self.path}: {exc}") from exc

        return await asyncio.get_running_loop().run_in_executor(executor, call)

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        return asyncio.ensure_future(self._run(self._reader, fn, write=False))

    async def open(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._writer, self._open)

    async def close(self) -> None:
        for db, executor in ((self._write_db, self._writer), (self._read_db, self._reader)):
            if db is not None:
                await asyncio.get_running_loop().run_in_executor(executor, db.close)
        self._write_db = self._read_db = None
        self._writer.shutdown(wait=True)
        self._reader.shutdown(wait=True)

    async def ping(self) -> None:
        await self._read(lambda db: db.execute("SELECT 1").fetchone())

    dialect: Final = migrations.SQLITE.name

    async def write(self, fn: Callable[[Any], T]) -> T:
        """`fn(db)` in one write transaction on the writer (retention's batches)."""

        def run(db: sqlite3.Connection) -> T:
            with migrations.SQLITE.transaction(db):
                return fn(db)

        return await self._run(self._writer, run, write=True)

    async def ingest(self, batch: Batch) -> IngestResult:
        def write(db: sqlite3.Connection) -> IngestResult:
            db.execute("BEGIN IMMEDIATE")
            result = apply(db, batch)
            db.execute("COMMIT")
            return result

        return await self._run(self._writer, write, write=True)
