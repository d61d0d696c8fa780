"""The write side of both fleet stores: batches into the tables, in the caller's transaction,
in the SQL that SQLite and PostgreSQL both speak (`bridge.fleet.sql`).

`plan` composes a transaction's rows from its batches without a database (the stores call
it on the event loop, before the writer thread's turn, which every write waits for);
`write` runs them. Both (and `apply_many`, the two in one) take any DB-API connection
whose `execute(sql, params)` takes `?` placeholders and returns a cursor with `rowcount`,
plus `executemany(sql, rows)`:
`bridge.fleet.sqlite_store` passes its sqlite3 connection, `bridge.fleet.postgres_store` an
adapter that rewrites the placeholders, with a `Writer` of its own (its audit log is
partitioned with a de-duplication table, and it writes each table in one multi-row
statement). The rules kept here are `bridge.fleet.store`'s: only events new to the audit log
change the state, each once.

Group commit (`bridge.fleet.group_commit`) hands over hundreds of one-event batches at once,
so the batches of a transaction are written together, set-based, not one after the other:
each table gets one statement (or one `executemany`) per transaction, however many requests
it holds. The outcome is what applying the batches one by one, in order, gives:

- an event twice in the transaction (two requests carrying it) is new once, at its first
  occurrence, and a duplicate at the others;
- one instance row per VM: the earliest and latest event time, the attestation of its last
  event in order, and the identity of the latest event of its last batch (what an upsert
  per batch leaves);
- one heartbeat per VM, its latest (a later one wins a tie, as the conditional upsert's
  `<=` makes it when applied in order), carried by the VM's instance row, so a heartbeat
  writes that row once (`sql.HEARTBEAT_LATER`);
- one notice row per notice: the transitions folded in order by the forward-only rule
  (`bridge.fleet.state.newer`) give the one a sequence of conditional upserts would leave,
  whatever the stored row was: the rule keeps the greater (rank, time), and a finished
  notice, the first reached, never changes again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from bridge import contract
from bridge.fleet import bounds, sql, tallies
from bridge.fleet.state import RANK, newer, zone_of
from bridge.fleet.store import Accepted, Batch, IngestResult
from bridge.infra.sqlparams import chunks, marks

#: One audit-log row: source, id, type, instance, notice_id, time, received_at, ingest, body.
EventRow = tuple[str, str, str, str, str | None, float, float, str, str]
#: The instance row of `sql.INSTANCE_HEARTBEAT_COLUMNS` (the identity, times and
#: attestation, then the heartbeat's columns, all None when the transaction holds no
#: heartbeat of the VM).
InstanceRow = tuple[Any, ...]


def _epoch(value: Any) -> float:
    return float(value.timestamp())


def _notice_id(event: contract.Event) -> str | None:
    data = event.data
    if isinstance(data, contract.MaintenanceData | contract.TriggerData):
        return data.notice_id
    return None


def _flag(value: bool | None) -> int | None:
    return None if value is None else int(value)


class Writer(Protocol):
    """How a dialect writes each table's rows of a transaction (in `db`'s transaction)."""

    def insert_events(self, db: Any, rows: list[EventRow]) -> set[tuple[str, str]]:
        """Append the events of `rows` (unique by source and id, in order) the audit log does
        not hold yet; the (source, id) of those that were new."""

    def upsert_instances(self, db: Any, rows: list[InstanceRow]) -> None:
        """Upsert the instance `rows` (one per instance) with their heartbeats, and move
        the instances the heartbeats make silent later in `silent_tallies`
        (`bridge.fleet.tallies.silent_moves`: no trigger does)."""

    def upsert_notices(self, db: Any, rows: list[tuple[Any, ...]]) -> None: ...


#: Instances the writer reads per statement before their upsert: what the heartbeats'
#: silent counts need (`tallies.HELD_COLUMNS`), then the identity (`sql.INSTANCE_IDENTITY`).
HELD_CHUNK: Final = 100
_HELD: Final = (
    f"SELECT {tallies.HELD_COLUMNS}, {', '.join(sql.INSTANCE_IDENTITY)} "  # noqa: S608 (constants)
    f"FROM instances WHERE source IN ({marks(HELD_CHUNK)})"
)
_IDENTITY_AT: Final = len(tallies.HELD_COLUMNS.split(","))


class RowWriter:
    """The shared statements, one execution per row (SQLite: each is a few microseconds in
    the engine, and a multi-row statement measured no faster).

    The instances are read before their upsert, a chunk per statement: the heartbeats'
    silent counts need their rows as they were, and the identity, which next to never
    changes, is compared here, so that `sql.UPDATE_IDENTITY` runs only for the rows whose
    identity moved (run for every row, it was an index seek per instance per transaction,
    a tenth of a heartbeat's cost, to write nothing)."""

    def insert_events(self, db: Any, rows: list[EventRow]) -> set[tuple[str, str]]:
        inserted: set[tuple[str, str]] = set()
        for row in rows:
            if db.execute(sql.INSERT_EVENT, row).rowcount == 1:
                inserted.add((row[0], row[1]))
        return inserted

    def upsert_instances(self, db: Any, rows: list[InstanceRow]) -> None:
        held: list[tuple[Any, ...]] = []
        for chunk in chunks(rows, HELD_CHUNK):
            sources = [row[0] for row in chunk]
            sources += [None] * (HELD_CHUNK - len(sources))  # one statement text, cached
            held += db.execute(_HELD, sources).fetchall()
        beating = [row for row in rows if row[14] is not None]
        if len(beating) < len(rows):
            db.executemany(sql.UPSERT_INSTANCE, [row[:14] for row in rows if row[14] is None])
        if beating:
            db.executemany(sql.UPSERT_INSTANCE_HEARTBEAT, beating)
        # The rows whose identity moved (a new instance's insert wrote its own); the trigger
        # moves their silent tallies.
        stored = {found[0]: found[_IDENTITY_AT:] for found in held}
        moved = [
            row[:14]
            for row in rows
            if (identity := stored.get(row[0])) is not None and identity != (*row[1:11], row[13])
        ]
        if moved:
            db.executemany(sql.UPDATE_IDENTITY, moved)
        if beating:
            tallies.move_silent(db, tallies.silent_moves(held, beating, regroup=False))

    def upsert_notices(self, db: Any, rows: list[tuple[Any, ...]]) -> None:
        db.executemany(sql.UPSERT_NOTICE, rows)


ROWS = RowWriter()
#: The heartbeat columns of an instance row whose VM sent none in the transaction.
_NO_HEARTBEAT: Final = (None,) * len(sql.HEARTBEAT_COLUMNS)


def apply(db: Any, batch: Batch, writer: Writer = ROWS) -> IngestResult:
    """Write `batch` with `db` inside the caller's transaction; what was new, known, refused."""
    (result,) = apply_many(db, [batch], writer)
    return result


def apply_many(db: Any, batches: Sequence[Batch], writer: Writer = ROWS) -> list[IngestResult]:
    """Write `batches` with `db` inside the caller's transaction, each table once (see the
    module docstring); per batch, what was new, known, refused."""
    return write(db, plan(batches), writer)


@dataclass(frozen=True, slots=True)
class _State:
    """What the new events of a transaction change: per batch the new events and their
    lags; the instance rows (`_merge_instance`'s lists), the latest heartbeat per VM and the
    notice rows, one per key."""

    new: list[int]
    lags: list[list[float]]
    instances: dict[str, list[Any]]
    heartbeats: dict[str, tuple[Any, ...]]
    notices: dict[tuple[str, str], tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class Plan:
    """A transaction's rows, composed before the writer's turn (`plan`): the audit-log rows,
    each event's place, and the state as it is when every event is new to the audit log
    (most transactions: `write` keeps it when the inserts say so, else folds the new ones
    again)."""

    batches: Sequence[Batch]
    events: list[EventRow]
    first: dict[tuple[str, str], int]  # (source, id) -> its first position in `placed`
    placed: list[tuple[int, Accepted]]  # (batch index, item) in order
    all_new: _State


def plan(batches: Sequence[Batch]) -> Plan:
    """Compose `batches`' rows without a database: the stores call it before handing the
    transaction to their writer thread, whose turn is the throughput's limit (the event
    loop that calls it is mostly idle meanwhile)."""
    events: list[EventRow] = []
    first: dict[tuple[str, str], int] = {}
    placed: list[tuple[int, Accepted]] = []
    for index, batch in enumerate(batches):
        for item in batch.accepted:
            event = item.event
            key = (event.source, event.id)
            if key not in first:
                first[key] = len(placed)
                events.append(
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
                    )
                )
            placed.append((index, item))
    return Plan(batches, events, first, placed, _fold(batches, first, placed, None))


def _fold(
    batches: Sequence[Batch],
    first: dict[tuple[str, str], int],
    placed: list[tuple[int, Accepted]],
    inserted: set[tuple[str, str]] | None,
) -> _State:
    """The state the events new to the audit log change: the first occurrence of each
    event that `inserted` holds (None: of every event)."""
    state = _State([0] * len(batches), [[] for _ in batches], {}, {}, {})
    instances, heartbeats, notices = state.instances, state.heartbeats, state.notices
    for position, (index, item) in enumerate(placed):
        event = item.event
        key = (event.source, event.id)
        if first[key] != position or (inserted is not None and key not in inserted):
            continue
        batch = batches[index]
        state.new[index] += 1
        time = _epoch(event.time)
        state.lags[index].append(batch.received_at - time)
        seen = bounds.liveness_time(time, batch.received_at)
        attested = batch.attested if item.attested is None else item.attested
        _merge_instance(instances, event, seen, _flag(attested), index)
        data = event.data
        if isinstance(data, contract.HeartbeatData):
            latest = heartbeats.get(event.source)
            if latest is None or seen >= latest[0]:
                heartbeats[event.source] = (
                    seen,
                    data.interval_seconds,
                    data.agent_version,
                    int(data.watcher_healthy),
                    data.spool_depth,
                    _epoch(data.started_at),
                )
        elif isinstance(data, contract.MaintenanceData):
            notice = (
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
            held = notices.get((event.source, data.notice_id))
            if held is None or newer(held[6], held[8], data.status, time):
                notices[(event.source, data.notice_id)] = notice
    return state


def write(db: Any, planned: Plan, writer: Writer = ROWS) -> list[IngestResult]:
    """Write the transaction `planned` with `db` inside the caller's transaction; per
    batch, what was new, known, refused."""
    batches = planned.batches
    inserted = writer.insert_events(db, planned.events) if planned.events else set()
    state = planned.all_new
    if len(inserted) < len(planned.events):  # duplicates: the state of the new ones only
        state = _fold(batches, planned.first, planned.placed, inserted)
    if state.instances:
        writer.upsert_instances(
            db,
            [
                (*row[:14], *state.heartbeats.get(source, _NO_HEARTBEAT))
                for source, row in state.instances.items()
            ],
        )
    if state.notices:
        writer.upsert_notices(db, list(state.notices.values()))
    rejected = [
        (batch.ingest, batch.received_at, r.reason, r.body.decode("utf-8", "replace"))
        for batch in batches
        for r in batch.refused
    ]
    if rejected:
        db.executemany(sql.INSERT_REJECTED, rejected)
    checkpoints = [
        (batch.ingest, part, pos, batch.received_at)
        for batch in batches
        for part, pos in batch.checkpoints.items()
    ]
    if checkpoints:
        db.executemany(sql.UPSERT_CHECKPOINT, checkpoints)
    new = state.new
    tallies.bump(db, sum(new), len(rejected))
    results = []
    for index, batch in enumerate(batches):
        count = len(batch.accepted)
        results.append(
            IngestResult(
                new[index], count - new[index], len(batch.refused), tuple(state.lags[index])
            )
        )
    return results


def _merge_instance(
    instances: dict[str, list[Any]],
    event: contract.Event,
    time: float,
    attested: int | None,
    batch: int,
) -> None:
    """One instance row per source: the earliest and latest event time, the attestation of
    its last event in order, and the identity an upsert per batch would leave: that of the
    latest event of the last batch holding one (the upsert takes each batch's as it comes)."""
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
    if row is None:  # the upsert's columns, then the batch and its latest time so far
        instances[event.source] = [*identity, time, time, attested, batch, time]
        return
    if batch != row[14] or time >= row[15]:
        row[:11] = identity
        row[14], row[15] = batch, time if batch != row[14] else max(row[15], time)
    row[11], row[12], row[13] = min(row[11], time), max(row[12], time), attested
