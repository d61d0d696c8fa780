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
from bridge.fleet import bounds, paging, sql, tallies
from bridge.fleet.state import FINISHED_RANK, RANK, zone_of
from bridge.fleet.store import (
    ATTESTATIONS,
    Accepted,
    Batch,
    EventPage,
    EventQuery,
    IngestResult,
    InstanceQuery,
    NoticeFilter,
    StartFilter,
    StoreError,
    UnstorableError,
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
_HISTORY_BY_KEY: Final = (
    "SELECT e.source, e.notice_id, e.type, e.id, e.time, "  # noqa: S608 (constants only)
    f"CASE WHEN e.type IN ('{contract.APPROVED}', '{contract.HOOK_COMPLETED}') "
    "THEN e.body END, e.seq FROM events e"
)
#: Notices whose histories one statement reads (two parameters each).
HISTORY_CHUNK: Final = 500
#: The sort position of a notice with no known start: after every real time.
NO_START: Final = 9e18
#: The notices' list order, and the keyset of their cursors (`notices_order` indexes it).
NOTICE_START: Final = "COALESCE(n.not_before, 9e18)"  # written as in the index
NOTICE_ORDER: Final = f"{NOTICE_START}, n.time, n.source, n.notice_id"
_INSTANCES: Final = (
    "SELECT source, provider, name, instance_id, zone, location, project, subscription, "
    "resource_group, scale_set, resource_id, first_seen, last_seen, last_heartbeat, "
    "heartbeat_interval, agent_version, watcher_healthy, spool_depth, started_at, attested "
    "FROM instances"
)
_EVENTS: Final = "SELECT seq, ingest, received_at, body FROM events"


#: `instances.attested` (1, 0, NULL) as the API, the page and the metrics name it (#34).
ATTESTATION: Final = dict(zip((1, 0, None), ATTESTATIONS, strict=True))
ATTESTED_VALUE: Final = {name: value for value, name in ATTESTATION.items() if value is not None}
UNCHECKED: Final = ATTESTATION[None]


def _epoch(value: Any) -> float:
    return float(value.timestamp())


def _rfc3339(value: float | None) -> str | None:
    return None if value is None else contract.epoch_rfc3339(value)


def _notice_id(event: contract.Event) -> str | None:
    data = event.data
    if isinstance(data, contract.MaintenanceData | contract.TriggerData):
        return data.notice_id
    return None


def apply(db: Any, batch: Batch) -> IngestResult:
    """Write `batch` with `db` inside the caller's transaction (any DB-API connection whose
    placeholders are `?`). Returns what was new, known, refused.

    Only the events the audit log did not have yet change the state, each once: one
    instance upsert per VM of the batch, then the heartbeats and notices in batch order (the
    notice upsert's forward-only rule makes that order irrelevant anyway).
    """
    items = list(batch.accepted)
    inserted = _insert_events(db, batch, items)
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
        seen = bounds.liveness_time(time, batch.received_at)
        _merge_instance(instances, event, seen)
        data = event.data
        if isinstance(data, contract.HeartbeatData):
            heartbeats.append(
                (
                    seen,
                    data.interval_seconds,
                    data.agent_version,
                    int(data.watcher_healthy),
                    data.spool_depth,
                    _epoch(data.started_at),
                    event.source,
                    seen,
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
    attested = None if batch.attested is None else int(batch.attested)
    db.executemany(sql.UPSERT_INSTANCE, [(*row, attested) for row in instances.values()])
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
    tallies.bump(db, len(applied), len(batch.refused))
    return IngestResult(len(applied), len(items) - len(applied), len(batch.refused), tuple(lags))


def _insert_events(db: Any, batch: Batch, items: list[Accepted]) -> set[tuple[str, str]]:
    """Append `items` to the audit log; the (source, id) of those that were new.

    One statement per event: measured faster in SQLite than a multi-row INSERT ... RETURNING.
    """
    inserted: set[tuple[str, str]] = set()
    for item in items:
        event = item.event
        cursor = db.execute(
            sql.INSERT_EVENT,
            (
                event.source,
                event.id,
                event.type,
                event.instance.name,
                _notice_id(event),
                _epoch(event.time),
                batch.received_at,
                batch.ingest,
                item.body.decode(),
            ),
        )
        if cursor.rowcount == 1:
            inserted.add((event.source, event.id))
    return inserted


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


def _notice_where(
    where: NoticeFilter, in_force: bool, starts: StartFilter = None
) -> tuple[str, list[Any]]:
    """The WHERE clause of a notice query (`n` is the notices table)."""
    search = None
    if where.search:
        search = "%" + "".join(f"!{c}" if c in "!%_" else c for c in where.search) + "%"
    return _where(
        [
            (f"n.rank < {FINISHED_RANK}", True if in_force else None),
            ("n.provider = ?", where.provider),
            ("n.zone = ?", where.zone),
            ("n.kind = ?", where.kind),
            ("n.status = ?", where.status),
            ("(n.instance = ? OR n.source = ?)", where.instance),
            (
                "(n.instance LIKE ? ESCAPE '!' OR n.notice_id LIKE ? ESCAPE '!' "
                "OR n.zone LIKE ? ESCAPE '!' OR n.source LIKE ? ESCAPE '!')",
                search,
            ),
            (f"{NOTICE_START} <= ?", starts if not isinstance(starts, str) else None),
            ("n.not_before IS NULL", True if starts == "unknown" else None),
        ]
    )


class Reads:
    """The store's queries over a DB-API connection with `?` placeholders."""

    @staticmethod
    def notices(db: Any, where: NoticeFilter, in_force: bool) -> list[dict[str, Any]]:
        return Reads.notice_rows(db, where, in_force, None, None)[0]

    @staticmethod
    def notice_page(
        db: Any, where: NoticeFilter, cursor: str | None, limit: int, starts: StartFilter
    ) -> paging.Page:
        after = paging.decode(cursor, 4) if cursor else None
        rows, keys = Reads.notice_rows(db, where, True, after, limit + 1, starts)
        return paging.page_of(rows, limit, lambda row: keys[id(row)])

    @staticmethod
    def notice_rows(
        db: Any,
        where: NoticeFilter,
        in_force: bool,
        after: Sequence[Any] | None,
        limit: int | None,
        starts: StartFilter = None,
    ) -> tuple[list[dict[str, Any]], dict[int, tuple[Any, ...]]]:
        """Notices in the list's order (soonest `not_before` first, unknown last) after the
        keyset position `after`, at most `limit`; and each one's sort key (by `id`)."""
        clause, params = _notice_where(where, in_force, starts)
        if after is not None:
            keyset = f"({NOTICE_ORDER}) > (?, ?, ?, ?)"
            clause = f"{clause} AND {keyset}" if clause else f" WHERE {keyset}"
            params.extend(after)
        query = f"{_NOTICES}{clause} ORDER BY {NOTICE_ORDER}"
        if limit is not None:
            query += f" LIMIT {int(limit)}"
        rows = db.execute(query, params).fetchall()
        notices: dict[tuple[str, str], dict[str, Any]] = {}
        keys: dict[int, tuple[Any, ...]] = {}
        for source, notice_id, provider, name, zone, kind, status, time, nb, eid, body in rows:
            window = _WINDOW.decode(body).data.window
            notice = notices[(source, notice_id)] = {
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
            keys[id(notice)] = (NO_START if nb is None else nb, time, source, notice_id)
        if notices:
            Reads._histories(db, notices)
        return list(notices.values()), keys

    @staticmethod
    def _histories(db: Any, notices: dict[tuple[str, str], dict[str, Any]]) -> None:
        """Each notice's transitions, approvals and hook outcomes, read by key through the
        audit log's (source, notice_id) index, a chunk of notices per statement."""
        history: list[tuple[Any, ...]] = []
        wanted = list(notices)
        for start in range(0, len(wanted), HISTORY_CHUNK):
            chunk = wanted[start : start + HISTORY_CHUNK]
            values = ", ".join(["(?, ?)"] * len(chunk))
            history += db.execute(
                f"{_HISTORY_BY_KEY} JOIN (VALUES {values}) k "
                "ON e.source = k.column1 AND e.notice_id = k.column2",
                [part for key in chunk for part in key],
            ).fetchall()
        # Ordered here, not in SQL: an ORDER BY on events lets the planner walk the whole
        # audit log by time instead of the few notices' histories by index.
        history.sort(key=lambda r: (r[4], r[6]))
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
        return Reads._instance_rows(cursor)

    @staticmethod
    def _instance_rows(cursor: Any) -> list[dict[str, Any]]:
        names = [column[0] for column in cursor.description]
        result = []
        for row in cursor.fetchall():
            item = dict(zip(names, row, strict=True))
            if item["watcher_healthy"] is not None:
                item["watcher_healthy"] = bool(item["watcher_healthy"])
            item["attestation"] = ATTESTATION[item.pop("attested")]
            result.append(item)
        return result

    @staticmethod
    def instance_page(db: Any, query: InstanceQuery) -> paging.Page:
        silent_at = tallies.SILENT_AT
        conditions: list[tuple[str, Any]] = [
            ("provider = ?", query.provider),
            ("zone = ?", query.zone),
            (f"{silent_at} < ?", query.now if query.state == "silent" else None),
            (f"{silent_at} >= ?", query.now if query.state == "reporting" else None),
            ("attested IS NULL", True if query.attestation == UNCHECKED else None),
            ("attested = ?", ATTESTED_VALUE.get(query.attestation or "")),
        ]
        if query.search:
            # A part of the name (SQLite's LIKE ignores ASCII case; PostgreSQL's adapter
            # makes it ILIKE) or the exact source: a scan of the names, never of the sources.
            escaped = "".join(f"!{c}" if c in "!%_" else c for c in query.search)
            conditions.append(("(name LIKE ? ESCAPE '!' OR source = ?)", True))
        clause, params = _where(conditions)
        if query.search:
            params[-2:] = [f"%{escaped}%", query.search]
        if query.cursor:
            keyset = "(name, source) > (?, ?)"
            clause = f"{clause} AND {keyset}" if clause else f" WHERE {keyset}"
            params.extend(paging.decode(query.cursor, 2))
        cursor = db.execute(
            f"{_INSTANCES}{clause} ORDER BY name, source LIMIT ?", [*params, query.limit + 1]
        )
        rows = Reads._instance_rows(cursor)
        page = paging.page_of(rows, query.limit, lambda row: (row["name"], row["source"]))
        in_force = Reads.notice_ids(db, [row["source"] for row in page.rows])
        for row in page.rows:
            row["notices"] = in_force.get(row["source"], [])
        return page

    @staticmethod
    def attestation_counts(db: Any) -> dict[str, int]:
        """Instances attested and unattested (through the partial index `instances_attested`:
        nothing read while no source checks identity); `unchecked` is the rest of the
        instances the tallies count."""
        found = dict.fromkeys(ATTESTATION.values(), 0)
        for attested, n in db.execute(
            "SELECT attested, COUNT(*) FROM instances WHERE attested IS NOT NULL GROUP BY attested"
        ).fetchall():
            found[ATTESTATION[attested]] = int(n)
        checked = found["attested"] + found["unattested"]
        found[UNCHECKED] = Reads.counts(db)["instances"] - checked
        return found

    @staticmethod
    def notice_ids(db: Any, sources: Sequence[str]) -> dict[str, list[str]]:
        """The ids of the notices in force of each of `sources`, soonest first."""
        found: dict[str, list[str]] = {}
        for start in range(0, len(sources), HISTORY_CHUNK):
            chunk = sources[start : start + HISTORY_CHUNK]
            marks = ", ".join("?" * len(chunk))
            rows = db.execute(
                f"SELECT n.source, n.notice_id FROM notices n WHERE n.source IN ({marks}) "  # noqa: S608
                f"AND n.rank < {FINISHED_RANK} ORDER BY {NOTICE_ORDER}",
                list(chunk),
            ).fetchall()
            for source, notice_id in rows:
                found.setdefault(str(source), []).append(str(notice_id))
        return found

    @staticmethod
    def notice_groups(db: Any, where: NoticeFilter) -> list[tuple[str, str, str, str, int]]:
        clause, params = _notice_where(where, True)
        rows = db.execute(
            "SELECT n.provider, COALESCE(n.zone, ''), n.kind, n.status, COUNT(*) "  # noqa: S608
            f"FROM notices n{clause} GROUP BY n.provider, COALESCE(n.zone, ''), n.kind, "
            "n.status",
            params,
        ).fetchall()
        return [(str(p), str(z), str(k), str(s), int(n)) for p, z, k, s, n in rows]

    @staticmethod
    def rejected_page(db: Any, cursor: str | None, limit: int) -> paging.Page:
        before = int(paging.decode(cursor, 1)[0]) if cursor else None
        clause = " WHERE seq < ?" if before is not None else ""
        params = [before] if before is not None else []
        rows = db.execute(
            "SELECT seq, ingest, received_at, reason, body FROM rejected"  # noqa: S608
            f"{clause} ORDER BY seq DESC LIMIT ?",
            [*params, limit + 1],
        ).fetchall()
        found = [
            {"seq": s, "ingest": i, "received_at": _rfc3339(r), "reason": why, "body": b}
            for s, i, r, why, b in rows
        ]
        return paging.page_of(found, limit, lambda row: (row["seq"],))

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
    def last_sequence(db: Any) -> int:
        (last,) = db.execute("SELECT MAX(seq) FROM events").fetchone()
        return int(last or 0)

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
        kept = tallies.read(db)
        if kept is not None:
            return sorted(
                (p, z or None, k, s, n) for kind, p, z, k, s, n in kept if kind == "in_force"
            )
        rows = db.execute(
            "SELECT provider, zone, kind, status, COUNT(*) FROM notices WHERE rank < 2 "
            "GROUP BY provider, zone, kind, status ORDER BY provider, zone, kind, status"
        ).fetchall()
        return [(str(p), z, str(k), str(s), int(n)) for p, z, k, s, n in rows]

    @staticmethod
    def instance_counts(db: Any, now: float) -> list[tuple[str, str, str, int, int]]:
        """(provider, sidecar version, zone or "", instances, of which silent at `now`)."""
        kept = tallies.read(db)
        if kept is None:
            rows = db.execute(
                f"SELECT provider, COALESCE(agent_version, '{tallies.UNKNOWN_VERSION}'), "  # noqa: S608
                "COALESCE(zone, ''), COUNT(*) FROM instances GROUP BY 1, 2, 3"
            ).fetchall()
            totals = {(str(p), str(v), str(z)): int(n) for p, v, z, n in rows}
        else:
            totals = {(p, v, z): n for kind, p, v, z, _, n in kept if kind == "instances"}
        silent = {(p, v, z): n for p, v, z, n in tallies.silent_by(db, now)}
        return sorted((*key, n, silent.get(key, 0)) for key, n in totals.items())

    @staticmethod
    def counts(db: Any) -> dict[str, int]:
        kept = tallies.read(db)
        if kept is not None:
            found = dict.fromkeys(("events", "instances", "notices", "rejected"), 0)
            found["notices_in_force"] = 0
            for kind, *_keys, n in kept:
                if kind == "in_force":
                    found["notices_in_force"] += n
                elif kind in found:
                    found[kind] += n
            return found
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

    async def last_sequence(self) -> int:
        return await self._read(Reads.last_sequence)

    async def instance_page(self, query: InstanceQuery) -> paging.Page:
        return await self._read(lambda db: Reads.instance_page(db, query))

    async def notice_page(
        self, where: NoticeFilter, *, cursor: str | None, limit: int, starts: StartFilter = None
    ) -> paging.Page:
        return await self._read(lambda db: Reads.notice_page(db, where, cursor, limit, starts))

    async def notice_groups(self, where: NoticeFilter) -> list[tuple[str, str, str, str, int]]:
        return await self._read(lambda db: Reads.notice_groups(db, where))

    async def rejected_page(self, *, cursor: str | None, limit: int) -> paging.Page:
        return await self._read(lambda db: Reads.rejected_page(db, cursor, limit))

    async def rejected(self, limit: int = 100) -> list[dict[str, Any]]:
        return await self._read(lambda db: Reads.rejected(db, limit))

    async def notice_counts(self) -> list[tuple[str, str | None, str, str, int]]:
        return await self._read(Reads.notice_counts)

    async def counts(self) -> dict[str, int]:
        return await self._read(Reads.counts)

    async def instance_counts(self, now: float) -> list[tuple[str, str, str, int, int]]:
        return await self._read(lambda db: Reads.instance_counts(db, now))

    async def attestation_counts(self) -> dict[str, int]:
        return await self._read(Reads.attestation_counts)


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
            for statement in sql.schema(sql.SQLITE_SERIAL):
                db.execute(statement)
            if "attested" not in {row[1] for row in db.execute("PRAGMA table_info(instances)")}:
                db.execute(sql.ADD_ATTESTED.replace(" IF NOT EXISTS", ""))
            for statement in sql.READ_INDEXES:
                db.execute(statement)
            db.execute("BEGIN IMMEDIATE")
            tallies.prepare(db, tallies.sqlite_ddl())
            db.execute("COMMIT")
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
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read the fleet store at {self.path}: {exc}") from exc
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
        def probe(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            db.execute(sql.PROBE, (datetime.now(UTC).timestamp(),))
            db.execute("COMMIT")

        await self._read(lambda db: db.execute("SELECT 1").fetchone())
        await self._run(self._writer, probe, write=True)

    async def ingest(self, batch: Batch) -> IngestResult:
        (result,) = await self.ingest_many([batch])
        return result

    async def ingest_many(self, batches: Sequence[Batch]) -> list[IngestResult]:
        def write(db: sqlite3.Connection) -> list[IngestResult]:
            db.execute("BEGIN IMMEDIATE")
            results = [apply(db, batch) for batch in batches]
            db.execute("COMMIT")
            return results

        return await self._run(self._writer, write, write=True)

    async def transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def write(db: sqlite3.Connection) -> T:
            db.execute("BEGIN IMMEDIATE")
            result = fn(db)
            db.execute("COMMIT")
            return result

        return await self._run(self._writer, write, write=True)
