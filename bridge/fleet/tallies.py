"""Counts kept as events arrive, so that the summary, the metrics and the page never recount.

At 100,000 instances and a million audit events a `COUNT(*)` per request is hundreds of
milliseconds. The store keeps a `tallies` table instead, changed in the same transaction as
the rows it counts, so every replica on one PostgreSQL reads the same figures and a rolled
back ingest counts nothing:

- `instances` by (provider, sidecar version, zone): triggers on `instances` (an insert, or
  an update that changes one of them: a heartbeat naming a new build);
- `notices` (all) and `in_force` by (provider, zone, kind, status): triggers on `notices`;
- `events` and `rejected`: one increment per batch from `writes.apply` (a row trigger
  on the audit log would cost an upsert per event of every batch);
- `retired` instances (`bridge.fleet.retention`) by (provider, sidecar version, zone): a
  trigger on `instances.retired_at` (schema step 9; one figure before).

Which instances are `silent` depends on the time of the question. The moment each one
turns silent (`SILENT_AT`: its last heartbeat plus three of its intervals) is tallied by
minute in `silent_tallies`; `silent_by` sums the minutes before now and counts the current
minute through the index on `SILENT_AT`, so an outage of a whole region costs what a
healthy fleet does. `reporting` is the total minus those. A heartbeat moves its instance
to a later minute: the heartbeat writer (`writes.Writer.upsert_instances`) moves a
transaction's instances set-based (`silent_moves`, then one statement per minute and
group, not three per heartbeat: a row trigger's upserts were most of a heartbeat's cost on
PostgreSQL); triggers on `instances` count an insert and the other changes (an instance
moving to another zone, provider or version with its heartbeat unchanged: `SILENT_MOVED`
is the one rule deciding which side counts a change).

`prepare` creates the table and triggers (idempotent) and fills the table from the rows the
first time (a store written before tallies existed), under the caller's transaction: it is
schema step 6 (`bridge.fleet.migrations`). Retention (`bridge.fleet.retention`) takes what
it deletes off `events` and `rejected` in the same transaction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Final

from bridge.fleet.state import SILENT_AFTER_INTERVALS

#: The moment an instance turns silent (no heartbeat: 0, silent since ever). Written the
#: same in the index and in the queries, so both planners use the expression index.
SILENT_AT: Final = f"COALESCE(last_heartbeat + {SILENT_AFTER_INTERVALS} * heartbeat_interval, 0)"
UNKNOWN_VERSION: Final = "unknown"

TABLE: Final = """CREATE TABLE IF NOT EXISTS tallies (
    kind TEXT NOT NULL,
    k1 TEXT NOT NULL,
    k2 TEXT NOT NULL,
    k3 TEXT NOT NULL,
    k4 TEXT NOT NULL,
    n BIGINT NOT NULL,
    PRIMARY KEY (kind, k1, k2, k3, k4)
)"""
INDEXES: Final = (f"CREATE INDEX IF NOT EXISTS instances_silent_at ON instances (({SILENT_AT}))",)

_ADD: Final = (
    "INSERT INTO tallies (kind, k1, k2, k3, k4, n) VALUES ({values}) "
    "ON CONFLICT (kind, k1, k2, k3, k4) DO UPDATE SET n = tallies.n + excluded.n"
)


def _add(kind: str, row: str, keys: tuple[str, ...], delta: str) -> str:
    padded = [*(f"COALESCE({row}.{k}, '')" for k in keys), *(["''"] * (4 - len(keys)))]
    return _ADD.format(values=", ".join([f"'{kind}'", *padded, delta]))


_VERSION: Final = "COALESCE({row}.agent_version, '" + UNKNOWN_VERSION + "')"


def _instance(row: str, delta: str) -> str:
    version = _VERSION.format(row=row)
    return _ADD.format(
        values=f"'instances', {row}.provider, {version}, COALESCE({row}.zone, ''), '', {delta}",
    )


_NOTICE_KEYS: Final = ("provider", "zone", "kind", "status")
# One statement per change, each valid as a SQLite trigger step and a plpgsql statement.
_NOTICE_INSERT: Final = (
    _add("notices", "NEW", (), "1"),
    _add("in_force", "NEW", _NOTICE_KEYS, "CASE WHEN NEW.rank < 2 THEN 1 ELSE 0 END"),
)
_NOTICE_UPDATE: Final = (
    _add("in_force", "OLD", _NOTICE_KEYS, "CASE WHEN OLD.rank < 2 THEN -1 ELSE 0 END"),
    _add("in_force", "NEW", _NOTICE_KEYS, "CASE WHEN NEW.rank < 2 THEN 1 ELSE 0 END"),
)
_NOTICE_CHANGED: Final = " OR ".join(
    f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in (*_NOTICE_KEYS, "rank")
)
_INSTANCE_INSERT: Final = (_instance("NEW", "1"),)
_INSTANCE_UPDATE: Final = (_instance("OLD", "-1"), _instance("NEW", "1"))
_INSTANCE_CHANGED: Final = (
    "OLD.provider IS DISTINCT FROM NEW.provider "
    "OR OLD.agent_version IS DISTINCT FROM NEW.agent_version "
    "OR OLD.zone IS DISTINCT FROM NEW.zone"
)
#: Retention marks an instance retired, its next event clears the mark (an instance is
#: never inserted retired); counted by (provider, version, zone) like the instances, so the
#: page can show retired ones apart from the silent ones in each row. A retired instance
#: whose version or zone changes moves with it.
_RETIRED_UPDATE: Final = (
    _instance("OLD", "CASE WHEN OLD.retired_at IS NULL THEN 0 ELSE -1 END").replace(
        "'instances'", "'retired'"
    ),
    _instance("NEW", "CASE WHEN NEW.retired_at IS NULL THEN 0 ELSE 1 END").replace(
        "'instances'", "'retired'"
    ),
)
_RETIRED_CHANGED: Final = (
    "(OLD.retired_at IS NOT NULL OR NEW.retired_at IS NOT NULL) AND "
    f"((OLD.retired_at IS NULL) IS DISTINCT FROM (NEW.retired_at IS NULL) OR {_INSTANCE_CHANGED})"
)
_RETIRED_FILL: Final = (
    "INSERT INTO tallies (kind, k1, k2, k3, k4, n) "  # noqa: S608 (constants only)
    f"SELECT 'retired', provider, {_VERSION.format(row='instances')}, COALESCE(zone, ''), "
    "'', COUNT(*) FROM instances WHERE retired_at IS NOT NULL "
    f"GROUP BY provider, {_VERSION.format(row='instances')}, COALESCE(zone, '')"
)
_TRIGGERS: Final = (
    ("notices_tally_insert", "INSERT", "notices", None, _NOTICE_INSERT),
    ("notices_tally_update", "UPDATE", "notices", _NOTICE_CHANGED, _NOTICE_UPDATE),
    ("instances_tally_insert", "INSERT", "instances", None, _INSTANCE_INSERT),
    ("instances_tally_update", "UPDATE", "instances", _INSTANCE_CHANGED, _INSTANCE_UPDATE),
    ("instances_tally_retired", "UPDATE", "instances", _RETIRED_CHANGED, _RETIRED_UPDATE),
)

_FILL: Final = (
    "INSERT INTO tallies (kind, k1, k2, k3, k4, n) "
    "SELECT 'events', '', '', '', '', COUNT(*) FROM events",
    "INSERT INTO tallies (kind, k1, k2, k3, k4, n) "
    "SELECT 'rejected', '', '', '', '', COUNT(*) FROM rejected",
    "INSERT INTO tallies (kind, k1, k2, k3, k4, n) "
    "SELECT 'notices', '', '', '', '', COUNT(*) FROM notices",
    "INSERT INTO tallies (kind, k1, k2, k3, k4, n) "
    "SELECT 'in_force', provider, COALESCE(zone, ''), kind, status, COUNT(*) FROM notices "
    "WHERE rank < 2 GROUP BY provider, COALESCE(zone, ''), kind, status",
    "INSERT INTO tallies (kind, k1, k2, k3, k4, n) "  # noqa: S608 (constants only)
    f"SELECT 'instances', provider, {_VERSION.format(row='instances')}, COALESCE(zone, ''), "
    f"'', COUNT(*) FROM instances GROUP BY provider, {_VERSION.format(row='instances')}, "
    "COALESCE(zone, '')",
    _RETIRED_FILL,
    # The mark that the table holds the counts (an empty store is filled too).
    "INSERT INTO tallies (kind, k1, k2, k3, k4, n) VALUES ('ready', '', '', '', '', 1)",
)

# -- silent instances: when each turns silent, tallied by minute --------------------------

SILENT_TABLE: Final = """CREATE TABLE IF NOT EXISTS silent_tallies (
    minute BIGINT NOT NULL,
    provider TEXT NOT NULL,
    version TEXT NOT NULL,
    zone TEXT NOT NULL,
    n BIGINT NOT NULL,
    PRIMARY KEY (minute, provider, version, zone)
)"""
#: The minute (Unix seconds // 60) in which a row turns silent, per dialect: SQLite's CAST
#: truncates (the value is never negative), PostgreSQL's rounds, so it floors first.
_SQLITE_MINUTE: Final = "CAST(({at}) / 60 AS INTEGER)"
_POSTGRES_MINUTE: Final = "CAST(FLOOR(({at}) / 60) AS BIGINT)"


def _silent_at(row: str) -> str:
    return SILENT_AT.replace("last_heartbeat", f"{row}.last_heartbeat").replace(
        "heartbeat_interval", f"{row}.heartbeat_interval"
    )


def _silent_steps(minute: str, row: str, delta: str) -> list[str]:
    """Add `delta` to the minute `row` turns silent in (and drop the tally it emptied)."""
    at = minute.format(at=_silent_at(row))
    keys = f"{row}.provider, {_VERSION.format(row=row)}, COALESCE({row}.zone, '')"
    steps = [
        "INSERT INTO silent_tallies (minute, provider, version, zone, n) "  # noqa: S608
        f"VALUES ({at}, {keys}, {delta}) "
        "ON CONFLICT (minute, provider, version, zone) "
        "DO UPDATE SET n = silent_tallies.n + excluded.n"
    ]
    if delta.startswith("-"):
        steps.append(
            f"DELETE FROM silent_tallies WHERE minute = {at} AND provider = {row}.provider "  # noqa: S608
            f"AND version = {_VERSION.format(row=row)} AND zone = COALESCE({row}.zone, '') "
            "AND n = 0"
        )
    return steps


#: The trigger's share of the changes: an instance's group moved while its silent moment
#: did not. A change of the heartbeat (its time or interval) is the heartbeat writer's,
#: whatever else changed with it (`silent_moves` applies the same rule from the other side).
_SILENT_CHANGED: Final = (
    "OLD.last_heartbeat IS NOT DISTINCT FROM NEW.last_heartbeat "
    "AND OLD.heartbeat_interval IS NOT DISTINCT FROM NEW.heartbeat_interval "
    f"AND ({_INSTANCE_CHANGED})"
)


def _silent_triggers(minute: str) -> list[tuple[str, str, str, str | None, list[str]]]:
    return [
        ("instances_silent_insert", "INSERT", "instances", None, _silent_steps(minute, "NEW", "1")),
        (
            "instances_silent_update",
            "UPDATE",
            "instances",
            _SILENT_CHANGED,
            _silent_steps(minute, "OLD", "-1") + _silent_steps(minute, "NEW", "1"),
        ),
    ]


def _silent_fill(minute: str) -> str:
    at = minute.format(at=SILENT_AT)
    version = _VERSION.format(row="instances")
    return (
        "INSERT INTO silent_tallies (minute, provider, version, zone, n) "  # noqa: S608
        f"SELECT {at}, provider, {version}, COALESCE(zone, ''), COUNT(*) FROM instances "
        f"GROUP BY {at}, provider, {version}, COALESCE(zone, '')"
    )


#: What the heartbeat writer reads of an instance before writing its heartbeat (in its
#: transaction, before the instance upsert that carries the heartbeat: SQLite's writer is
#: alone; PostgreSQL's reads them `FOR NO KEY UPDATE`, so no other replica changes them in
#: between).
HELD_COLUMNS: Final = "source, last_heartbeat, heartbeat_interval, provider, agent_version, zone"
#: A move of `silent_moves`: (minute, provider, version, zone) -> the change of its count.
Moves = dict[tuple[int, str, str, str], int]


def silent_minute(last_heartbeat: float | None, interval: float | None) -> int:
    """The minute of `SILENT_AT` as the triggers compute it (0 without a heartbeat): the
    same double arithmetic, floored (SQLite's CAST truncates; the value is never negative)."""
    if last_heartbeat is None or interval is None:
        return 0
    return math.floor((last_heartbeat + SILENT_AFTER_INTERVALS * interval) / 60)


def silent_moves(
    held: Iterable[Sequence[Any]], rows: Iterable[Sequence[Any]], *, regroup: bool
) -> Moves:
    """The changes to `silent_tallies` of writing the heartbeats of the instance `rows`
    (`sql.INSTANCE_HEARTBEAT_COLUMNS`, heartbeat set; one per instance) over the instances
    as `held` (`HELD_COLUMNS` first, read before the upsert): each row whose heartbeat the upsert
    writes and that moves its silent moment leaves its old minute and group for its new
    ones. The new group takes the row's provider and zone when the same statement writes
    them (`regroup`: PostgreSQL's one upsert), else the held ones (SQLite: `UPDATE_IDENTITY`
    follows, and the trigger moves an instance whose group changes with its heartbeat
    unchanged). The rest are not this writer's (`_SILENT_CHANGED`): an instance not held
    (its insert trigger counts it as written), an older heartbeat (the upsert skips it),
    the same moment."""
    found = {str(row[0]): row for row in held}
    moves: Moves = {}
    for row in rows:
        source, time, interval, version = row[0], row[14], row[15], row[16]
        old = found.get(source)
        if old is None or time is None:
            continue
        last, every, provider, was, zone = old[1:6]
        if last is not None and last > time:
            continue  # a late heartbeat: the upsert skips it
        if (last, every) == (time, interval):
            continue
        zone = zone or ""
        leave = (silent_minute(last, every), provider, was or UNKNOWN_VERSION, zone)
        if regroup:
            provider, zone = row[1], row[4] or ""
        enter = (silent_minute(time, interval), provider, version or UNKNOWN_VERSION, zone)
        moves[leave] = moves.get(leave, 0) - 1
        moves[enter] = moves.get(enter, 0) + 1
    return {key: n for key, n in sorted(moves.items()) if n}


#: A move, and the drop of a tally it emptied (one row each: SQLite runs them per row;
#: PostgreSQL's writer has its multi-row forms).
SILENT_MOVE: Final = (
    "INSERT INTO silent_tallies (minute, provider, version, zone, n) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (minute, provider, version, zone) DO UPDATE SET n = silent_tallies.n + excluded.n"
)
SILENT_EMPTIED: Final = (
    "DELETE FROM silent_tallies WHERE minute = ? AND provider = ? AND version = ? AND zone = ? "
    "AND n = 0"
)


def move_silent(db: Any, moves: Moves) -> None:
    """Apply `moves` row by row (in the caller's transaction), in key order."""
    if moves:
        db.executemany(SILENT_MOVE, [(*key, n) for key, n in moves.items()])
        db.executemany(SILENT_EMPTIED, [key for key, n in moves.items() if n < 0])


#: `writes.apply`: the batch's new events and refused inputs, one statement each.
BUMP: Final = _ADD.format(values="?, '', '', '', '', ?")


def sqlite_ddl() -> list[str]:
    statements = [TABLE, SILENT_TABLE, *INDEXES]
    for name, event, table, when, steps in (*_TRIGGERS, *_silent_triggers(_SQLITE_MINUTE)):
        # SQLite's null-safe `IS NOT` (its IS DISTINCT FROM needs 3.39).
        when = when and when.replace(" IS NOT DISTINCT FROM ", " IS ")
        condition = f" WHEN {when.replace(' IS DISTINCT FROM ', ' IS NOT ')}" if when else ""
        body = "".join(f"{step}; " for step in steps)
        statements.append(
            f"CREATE TRIGGER IF NOT EXISTS {name} AFTER {event} ON {table} FOR EACH ROW"
            f"{condition} BEGIN {body}END"
        )
    return statements


def postgres_ddl() -> list[str]:
    statements = [TABLE, SILENT_TABLE, *INDEXES]
    for name, event, table, when, steps in (*_TRIGGERS, *_silent_triggers(_POSTGRES_MINUTE)):
        body = "".join(f"{step}; " for step in steps)
        condition = f" WHEN ({when})" if when else ""
        statements += [
            f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN {body}RETURN NULL; END $$",
            f"CREATE OR REPLACE TRIGGER {name} AFTER {event} ON {table} FOR EACH ROW"
            f"{condition} EXECUTE FUNCTION {name}()",
        ]
    return statements


def prepare(db: Any, ddl: list[str], lock: str | None = None, *, postgres: bool = False) -> None:
    """Create the tallies (idempotent) and fill them once from the rows, in the caller's
    transaction, which keeps writers out (SQLite's BEGIN IMMEDIATE; `lock` for PostgreSQL,
    where another replica may be ingesting)."""
    for statement in ddl:
        db.execute(statement)
    ready = db.execute("SELECT n FROM tallies WHERE kind = 'ready'").fetchone()
    if ready is None:
        if lock is not None:
            db.execute(lock)
        db.execute("DELETE FROM tallies")
        db.execute("DELETE FROM silent_tallies")
        for statement in _FILL:
            db.execute(statement)
        db.execute(_silent_fill(_POSTGRES_MINUTE if postgres else _SQLITE_MINUTE))


def regroup_retired(db: Any, *, postgres: bool = False) -> None:
    """Schema step 9: the retired instances counted by (provider, version, zone) instead of
    in one figure: the trigger made anew, the figures counted again (in the caller's
    transaction)."""
    if not postgres:  # SQLite has no CREATE OR REPLACE TRIGGER
        db.execute("DROP TRIGGER IF EXISTS instances_tally_retired")
    for statement in postgres_ddl() if postgres else sqlite_ddl():
        db.execute(statement)
    db.execute("DELETE FROM tallies WHERE kind = 'retired'")
    db.execute(_RETIRED_FILL)


def narrow_silent_trigger(db: Any, *, postgres: bool = False) -> None:
    """Schema step 10: the trigger on heartbeat changes made anew with `_SILENT_CHANGED`
    (the heartbeat writer moves those instances itself since); the figures stay."""
    if not postgres:  # SQLite has no CREATE OR REPLACE TRIGGER
        db.execute("DROP TRIGGER IF EXISTS instances_silent_update")
    for statement in postgres_ddl() if postgres else sqlite_ddl():
        db.execute(statement)


def bump(db: Any, events: int, rejected: int) -> None:
    """Count a batch's new events and refused inputs (inside its transaction)."""
    rows = [(kind, n) for kind, n in (("events", events), ("rejected", rejected)) if n]
    if rows:
        db.executemany(BUMP, rows)


#: Locks PostgreSQL takes before the first fill (writers wait; readers go on).
POSTGRES_FILL_LOCK: Final = (
    "LOCK TABLE events, rejected, notices, instances IN SHARE ROW EXCLUSIVE MODE"
)


def read(db: Any) -> list[tuple[str, str, str, str, str, int]]:
    """Every tally but zeros: (kind, k1, k2, k3, k4, n).

    Every open store has them: schema step 6 (`bridge.fleet.migrations`) made and filled
    them, and a read-only open refuses a store not upgraded yet. So nothing is caught here:
    a missing table is a broken store, and on PostgreSQL an error caught inside a
    transaction would leave it aborted for every later statement of that transaction."""
    rows = db.execute("SELECT kind, k1, k2, k3, k4, n FROM tallies WHERE n <> 0").fetchall()
    return [(str(a), str(b), str(c), str(d), str(e), int(n)) for a, b, c, d, e, n in rows]


def silent_by(db: Any, now: float, *, postgres: bool = False) -> list[tuple[str, str, str, int]]:
    """(provider, version, zone or "", count) of the instances silent at `now`: the minutes
    before the current one from `silent_tallies` (one row per minute and group), the current
    minute's from the index of when each turns silent - never a pass over every instance,
    however many are silent."""
    minute = int(now // 60)
    found: dict[tuple[str, str, str], int] = {}
    rows = db.execute(
        "SELECT provider, version, zone, SUM(n) FROM silent_tallies WHERE minute < ? "
        "GROUP BY provider, version, zone",
        (minute,),
    ).fetchall()
    # Grouped by the columns as they are (NULLs folded below): a region turning silent puts
    # thousands of rows in the current minute, and the expressions per row cost half the
    # time of that count.
    rows += db.execute(
        "SELECT provider, agent_version, zone, COUNT(*) FROM instances "  # noqa: S608
        f"WHERE {SILENT_AT} >= ? AND {SILENT_AT} < ? GROUP BY provider, agent_version, zone",
        (minute * 60.0, now),
    ).fetchall()
    for p, v, z, n in rows:
        key = (str(p), UNKNOWN_VERSION if v is None else str(v), "" if z is None else str(z))
        found[key] = found.get(key, 0) + int(n)
    return [(*key, n) for key, n in found.items() if n]
