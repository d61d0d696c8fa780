"""The write side of both fleet stores: one batch into the tables, in the caller's
transaction, in the SQL that SQLite and PostgreSQL both speak (`bridge.fleet.sql`).

`apply` runs over any DB-API connection whose `execute(sql, params)` takes `?`
placeholders and returns a cursor with `rowcount`, plus `executemany(sql, rows)`:
`bridge.fleet.sqlite_store` passes its sqlite3 connection, `bridge.fleet.postgres_store` an
adapter that rewrites the placeholders (and its own audit-log writer, `EventWriter`, since
its log is partitioned with a de-duplication table of its own). The rules kept here are
`bridge.fleet.store`'s: only events new to the audit log change the state, each once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bridge import contract
from bridge.fleet import bounds, sql, tallies
from bridge.fleet.state import RANK, zone_of
from bridge.fleet.store import Accepted, Batch, IngestResult


def _epoch(value: Any) -> float:
    return float(value.timestamp())


def _notice_id(event: contract.Event) -> str | None:
    data = event.data
    if isinstance(data, contract.MaintenanceData | contract.TriggerData):
        return data.notice_id
    return None


#: How `apply` appends a batch's events to the audit log: (db, batch, items) -> the
#: (source, id) of those that were new (PostgreSQL's partitioned log has its own).
EventWriter = Callable[[Any, Batch, list[Accepted]], set[tuple[str, str]]]


def _flag(value: bool | None) -> int | None:
    return None if value is None else int(value)


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
    attested: dict[str, bool | None] = {}
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
        attested[event.source] = batch.attested if item.attested is None else item.attested
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
    db.executemany(
        sql.UPSERT_INSTANCE,
        [(*row, _flag(attested[source])) for source, row in instances.items()],
    )
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
