"""The read side of both fleet stores: every query of `bridge.fleet.store.Store`, in the SQL
that SQLite and PostgreSQL both speak.

`Reads` holds the queries, each a function of a DB-API connection with `?` placeholders
(`execute(sql, params)` returning a cursor with `fetchall`, `fetchone`, `description`);
`ReadQueries` is the store's async read methods, one per query, each run through the
backend's own `_read` (SQLite: its reader thread and connection; PostgreSQL: a pooled
connection behind an adapter that rewrites the placeholders). Lists are keyset-paged
(`bridge.fleet.paging`); counts come from the tallies kept as events arrive
(`bridge.fleet.tallies`), never from a recount.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final, TypeVar

import msgspec

from bridge import contract
from bridge.fleet import paging, tallies
from bridge.fleet.state import FINISHED_RANK
from bridge.fleet.store import (
    ATTESTATIONS,
    EventPage,
    EventQuery,
    InstanceQuery,
    NoticeFilter,
    StartFilter,
)
from bridge.infra.sqlparams import chunks, marks

T = TypeVar("T")
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
#: Instances in a state (silent, reporting) below which a page of them is read through the
#: index of when each turns silent rather than by walking every name (SQLite): sorting
#: this many rows costs what walking about 100 names per match would.
FEW_IN_STATE: Final = 1_500
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
    "heartbeat_interval, agent_version, watcher_healthy, spool_depth, started_at, "
    "retired_at, attested FROM instances"
)
_EVENTS: Final = "SELECT seq, ingest, received_at, body FROM events"
#: One instance's audit log, by a name or a source: the sources that the instances of that
#: name have (their rows carry each source's latest name), read first, then their events
#: through the audit log's keys by source. The audit log keeps no index of its events' names
#: (schema step 12): that was a page written at a random place of it for every event.
_SOURCES_OF: Final = "SELECT source FROM instances WHERE name = ? LIMIT ?"
#: Sources one name may stand for (a name is not unique across clouds and projects; a few).
MAX_SOURCES_OF_NAME: Final = 100
#: SQLite's name of that key's index (the table's first UNIQUE constraint).
_BY_SOURCE: Final = " INDEXED BY sqlite_autoindex_events_1"

#: `instances.attested` (1, 0, NULL) as the API, the page and the metrics name it (#34).
ATTESTATION: Final = dict(zip((1, 0, None), ATTESTATIONS, strict=True))
ATTESTED_VALUE: Final = {name: value for value, name in ATTESTATION.items() if value is not None}
UNCHECKED: Final = ATTESTATION[None]


def _rfc3339(value: float | None) -> str | None:
    return None if value is None else contract.epoch_rfc3339(value)


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
            # `not_before IS NULL`, written as a seek of the list's index to its end (no
            # real time sorts there): IS NULL would walk every notice in force.
            (f"{NOTICE_START} >= ?", NO_START if starts == "unknown" else None),
        ]
    )


#: A search by a part of a name reads the trigram index (SQLite) when fewer names than this
#: hold it (`Reads._few_named`): sorting them is quick; more are found soon in order.
FEW_NAMED: Final = 1000
#: Characters of a trigram: shorter parts cannot be looked up in a trigram index.
TRIGRAM: Final = 3
_HAS_SEARCH_TABLE: Final = (
    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'instances_search'"
)


def _phrase(part: str) -> str:
    """An FTS5 query for names holding `part`: one phrase (its quotes doubled), which the
    trigram tokenizer matches as a substring, ignoring case."""
    return '"' + part.replace('"', '""') + '"'


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
        for chunk in chunks(wanted, HISTORY_CHUNK):
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
            places = marks(len(keys))
            cursor = db.execute(
                f"{_INSTANCES} WHERE name IN ({places}) OR source IN ({places}) "
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
            # As `state.instance_state` decides: retired first, then by the last heartbeat.
            ("retired_at IS NOT NULL", True if query.state == "retired" else None),
            ("retired_at IS NULL", True if query.state in ("silent", "reporting") else None),
            (f"{silent_at} < ?", query.now if query.state == "silent" else None),
            (f"{silent_at} >= ?", query.now if query.state == "reporting" else None),
            ("attested IS NULL", True if query.attestation == UNCHECKED else None),
            ("attested = ?", ATTESTED_VALUE.get(query.attestation or "")),
        ]
        indexed = bool(query.search) and Reads._few_named(db, query.search or "")
        if query.search and indexed:
            # SQLite: the few instances whose name holds the part, from the trigram index,
            # sorted (their rowids are the index's); or the exact source.
            conditions.append(
                (
                    "(rowid IN (SELECT rowid FROM instances_search WHERE name MATCH ?) "
                    "OR source = ?)",
                    True,
                )
            )
        elif query.search:
            # A part of the name (SQLite's LIKE ignores ASCII case; PostgreSQL's adapter
            # makes it ILIKE, which its trigram index serves) or the exact source: on SQLite
            # a walk of the names in the list's order, never of the sources.
            escaped = "".join(f"!{c}" if c in "!%_" else c for c in query.search)
            conditions.append(("(name LIKE ? ESCAPE '!' OR source = ?)", True))
        clause, params = _where(conditions)
        if query.search:
            part = _phrase(query.search) if indexed else f"%{escaped}%"
            params[-2:] = [part, query.search]
        if query.cursor:
            keyset = "(name, source) > (?, ?)"
            clause = f"{clause} AND {keyset}" if clause else f" WHERE {keyset}"
            params.extend(paging.decode(query.cursor, 2))
        hint = ""
        if query.state in ("silent", "reporting") and Reads._few_in_state(db, query):
            hint = " INDEXED BY instances_silent_at"
        cursor = db.execute(
            f"{_INSTANCES}{hint}{clause} ORDER BY name, source LIMIT ?",
            [*params, query.limit + 1],
        )
        rows = Reads._instance_rows(cursor)
        page = paging.page_of(rows, query.limit, lambda row: (row["name"], row["source"]))
        in_force = Reads.notice_ids(db, [row["source"] for row in page.rows])
        for row in page.rows:
            row["notices"] = in_force.get(row["source"], [])
        return page

    @staticmethod
    def _few_named(db: Any, part: str) -> bool:
        """SQLite with the trigram index (`instances_search`, schema step 11)
        and a part of three characters or more (a trigram: shorter parts walk the names,
        which for one or two characters match many and soon fill a page): whether fewer
        than `FEW_NAMED` names hold it. Then the page is those, sorted; more, and the walk
        of the names in order finds a page of them soon. PostgreSQL's planner makes the
        same choice with its trigram index and statistics."""
        if getattr(db, "postgres", False) or len(part) < TRIGRAM:
            return False
        if db.execute(_HAS_SEARCH_TABLE).fetchone() is None:
            return False  # a SQLite without FTS5's trigrams (logged at the upgrade)
        (found,) = db.execute(
            "SELECT COUNT(*) FROM (SELECT 1 FROM instances_search WHERE name MATCH ? "  # noqa: S608
            f"LIMIT {FEW_NAMED})",
            (_phrase(part),),
        ).fetchone()
        return int(found) < FEW_NAMED

    @staticmethod
    def _few_in_state(db: Any, query: InstanceQuery) -> bool:
        """SQLite only: whether fewer than `FEW_IN_STATE` instances are in the wanted state
        (a count of at most that many entries of the index on when each turns silent).
        SQLite has no statistics of that index's ranges, so it walks the list's order and
        checks each row: fine when most match, 100,000 rows read for the few silent ones
        of a healthy fleet. Then the page is read through that index and its few rows
        sorted. PostgreSQL's statistics make the same choice on their own."""
        if getattr(db, "postgres", False):
            return False
        side = "<" if query.state == "silent" else ">="
        (found,) = db.execute(
            f"SELECT COUNT(*) FROM (SELECT 1 FROM instances WHERE {tallies.SILENT_AT} "  # noqa: S608
            f"{side} ? LIMIT {FEW_IN_STATE})",
            (query.now,),
        ).fetchone()
        return int(found) < FEW_IN_STATE

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
        for source, notice_id, _body in Reads._in_force_of(db, sources, bodies=False):
            found.setdefault(source, []).append(notice_id)
        return found

    @staticmethod
    def _in_force_of(
        db: Any, sources: Sequence[str], *, bodies: bool
    ) -> list[tuple[str, str, str | None]]:
        """(source, notice id, current event or None) of the notices in force of `sources`,
        soonest first: primary key seeks, a chunk of sources per statement."""
        found: list[tuple[str, str, str | None]] = []
        column = "n.body" if bodies else "NULL"
        for chunk in chunks(sources, HISTORY_CHUNK):
            places = marks(len(chunk))
            rows = db.execute(
                f"SELECT n.source, n.notice_id, {column} FROM notices n "  # noqa: S608
                f"WHERE n.source IN ({places}) AND n.rank < {FINISHED_RANK} "
                f"ORDER BY {NOTICE_ORDER}",
                list(chunk),
            ).fetchall()
            found += [(str(s), str(i), None if b is None else str(b)) for s, i, b in rows]
        return found

    @staticmethod
    def instances_in_force(db: Any, keys: Sequence[str]) -> list[dict[str, Any]]:
        """The instances named by `keys` (names or sources), each with `notices`, the ids of
        its notices in force, and `notice_events`, their current events as received: what
        one instance's answer and `eligible` need, in two index reads (no histories)."""
        rows = Reads.instances(db, keys)
        ids: dict[str, list[str]] = {}
        events: dict[str, list[bytes]] = {}
        for source, notice_id, body in Reads._in_force_of(
            db, [row["source"] for row in rows], bodies=True
        ):
            ids.setdefault(source, []).append(notice_id)
            events.setdefault(source, []).append((body or "").encode())
        for row in rows:
            row["notices"] = ids.get(row["source"], [])
            row["notice_events"] = events.get(row["source"], [])
        return rows

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
                ("type = ?", query.type),
                ("time >= ?", query.since),
                ("time < ?", query.until),
            ]
        )
        postgres = getattr(db, "postgres", False)
        statement = f"{_EVENTS}{clause} ORDER BY seq LIMIT ?"
        if query.instance is not None:
            found = db.execute(_SOURCES_OF, (query.instance, MAX_SOURCES_OF_NAME)).fetchall()
            sources = [str(source) for (source,) in found] + [query.instance]
            of = f"source IN ({marks(len(sources))})"
            clause = f"{clause} AND {of}" if clause else f" WHERE {of}"
            params += sources
            if postgres:
                # Every event of those sources, through the keys by source, then in order:
                # without statistics (a store just filled) the planner would rather walk
                # the whole log in sequence order for the LIMIT (OFFSET 0 keeps it apart).
                inner = f"{_EVENTS}{clause} OFFSET 0"
                statement = f"SELECT * FROM ({inner}) AS e ORDER BY seq LIMIT ?"  # noqa: S608
            else:
                # SQLite has no statistics telling it that one instance's events are fewer
                # than one type's (it would walk every heartbeat): the (source, id) key it is.
                statement = f"{_EVENTS}{_BY_SOURCE}{clause} ORDER BY seq LIMIT ?"
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
        return sorted(
            (p, z or None, k, s, n)
            for kind, p, z, k, s, n in tallies.read(db)
            if kind == "in_force"
        )

    @staticmethod
    def instance_counts(db: Any, now: float) -> list[tuple[str, str, str, int, int]]:
        """(provider, sidecar version, zone or "", instances, of which silent at `now`)."""
        totals = {(p, v, z): n for kind, p, v, z, _, n in tallies.read(db) if kind == "instances"}
        silent = {(p, v, z): n for p, v, z, n in tallies.silent_by(db, now)}
        return sorted((*key, n, silent.get(key, 0)) for key, n in totals.items())

    @staticmethod
    def retired_counts(db: Any) -> list[tuple[str, str, str, int]]:
        """(provider, sidecar version, zone or "", retired instances), from the tallies."""
        return sorted((p, v, z, n) for kind, p, v, z, _, n in tallies.read(db) if kind == "retired")

    @staticmethod
    def counts(db: Any) -> dict[str, int]:
        found = dict.fromkeys(("events", "instances", "notices", "rejected"), 0)
        found["notices_in_force"] = found["instances_retired"] = 0
        for kind, *_keys, n in tallies.read(db):
            if kind == "in_force":
                found["notices_in_force"] += n
            elif kind == "retired":
                found["instances_retired"] += n
            elif kind in found:
                found[kind] += n
        return found

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

    async def instances_in_force(self, keys: Sequence[str]) -> list[dict[str, Any]]:
        return await self._read(lambda db: Reads.instances_in_force(db, keys))

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

    async def retired_counts(self) -> list[tuple[str, str, str, int]]:
        return await self._read(Reads.retired_counts)
