"""PostgreSQL's audit log partitioned by month, and its de-duplication table.

Schema step 3 (`bridge.fleet.migrations`) turns `events` into a table partitioned by range
of `received_at` (Unix seconds), one partition per UTC month (`events_2026_11`) and a
DEFAULT partition for rows outside every month created so far. Retention then drops a month
that lies entirely before the cutoff (`drop_older`: one `DROP TABLE`, no row deleted), where
an unpartitioned table would delete and vacuum millions of rows.

PostgreSQL enforces a unique key on a partitioned table only if the key holds the partition
column, and the CloudEvents identity (source, id) does not: the same event received twice
has two receive times. So idempotence moves to `event_keys`, a plain table with the primary
key (source, id): `insert_events` first inserts the batch's keys there (`ON CONFLICT DO
NOTHING RETURNING`: the keys that were new), then only those events into `events`, both as
one multi-row statement over arrays (`unnest`), whose text never changes, so the server
plans it once per connection (prepared statements). The rows of `event_keys` are pruned
with the same retention as their events (`prune_keys`: heartbeats' keys with the
heartbeats, the others once their month is dropped), in batches.

Partitions are made ahead (`ensure_months`: this month and the next, at every open and
retention pass) under the migration lock, so replicas never race to create one. Rows that
landed in DEFAULT (a receive time outside every partition, e.g. a clock far off) are moved
into their month's partition when it is created, then it is attached.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from bridge import contract
from bridge.fleet import tallies
from bridge.fleet.sql import POSTGRES_SCHEMA_LOCK as _LOCK

_HEARTBEAT: Final = contract.HEARTBEAT
_MONTH: Final = re.compile(r"^events_(\d{4})_(\d{2})$")
#: How long a partition change waits for the locks it needs before giving up for this pass.
LOCK_TIMEOUT: Final = "2s"
EVENT_COLUMNS: Final = "source, id, type, instance, notice_id, time, received_at, ingest, body"


def month_of(moment: float) -> tuple[int, int]:
    when = datetime.fromtimestamp(moment, UTC)
    return when.year, when.month


def bounds(year: int, month: int) -> tuple[float, float]:
    """The month's [start, end) in Unix seconds."""
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return start.timestamp(), end.timestamp()


def next_month(year: int, month: int) -> tuple[int, int]:
    return year + month // 12, month % 12 + 1


def partition_name(year: int, month: int) -> str:
    return f"events_{year:04d}_{month:02d}"


def step(db: Any, now: float) -> None:
    """Schema step 3: the audit log as a partitioned table and `event_keys`, the rows of
    the unpartitioned table moved over in order (their sequence numbers kept: API cursors
    stay valid)."""
    for old, new in (
        ("events", "events_unpartitioned"),
        ("events_pkey", "events_unpartitioned_pkey"),
        ("events_source_id_key", "events_unpartitioned_source_id_key"),
        ("events_notice", "events_unpartitioned_notice"),
        ("events_instance", "events_unpartitioned_instance"),
        ("events_time", "events_unpartitioned_time"),
        ("events_heartbeat_received", "events_unpartitioned_heartbeat"),
    ):
        kind = "TABLE" if old == "events" else "INDEX"
        db.execute(f"ALTER {kind} {old} RENAME TO {new}")
    (last,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM events_unpartitioned").fetchone()
    for statement in (
        f"CREATE SEQUENCE events_sequence AS BIGINT START WITH {int(last) + 1}",
        "CREATE TABLE events ("
        "seq BIGINT NOT NULL DEFAULT nextval('events_sequence'), "
        "source TEXT NOT NULL, id TEXT NOT NULL, type TEXT NOT NULL, instance TEXT NOT NULL, "
        "notice_id TEXT, time DOUBLE PRECISION NOT NULL, "
        "received_at DOUBLE PRECISION NOT NULL, ingest TEXT NOT NULL, body TEXT NOT NULL, "
        "PRIMARY KEY (seq, received_at)) PARTITION BY RANGE (received_at)",
        "ALTER SEQUENCE events_sequence OWNED BY events.seq",
        "CREATE TABLE events_default PARTITION OF events DEFAULT",
        "CREATE INDEX events_notice ON events (source, notice_id)",
        "CREATE INDEX events_instance ON events (instance)",
        "CREATE INDEX events_time ON events (time)",
        "CREATE INDEX events_heartbeat_received ON events (received_at) "
        f"WHERE type = '{_HEARTBEAT}'",
        "CREATE TABLE event_keys (source TEXT NOT NULL, id TEXT NOT NULL, "
        "received_at DOUBLE PRECISION NOT NULL, heartbeat BOOLEAN NOT NULL, "
        "PRIMARY KEY (source, id))",
        "CREATE INDEX event_keys_age ON event_keys (heartbeat, received_at)",
    ):
        db.execute(statement)
    (first,) = db.execute("SELECT MIN(received_at) FROM events_unpartitioned").fetchone()
    ensure_months(db, [now] if first is None else [float(first), now])
    db.execute(
        f"INSERT INTO events (seq, {EVENT_COLUMNS}) "  # noqa: S608 (constants)
        f"SELECT seq, {EVENT_COLUMNS} FROM events_unpartitioned ORDER BY seq"
    )
    db.execute(
        "INSERT INTO event_keys (source, id, received_at, heartbeat) "  # noqa: S608 (constants)
        f"SELECT source, id, received_at, type = '{_HEARTBEAT}' FROM events_unpartitioned"
    )
    db.execute("DROP TABLE events_unpartitioned")


def ensure_months(db: Any, moments: Sequence[float]) -> int:
    """Every month from the earliest of `moments` to the month after the latest has its
    partition (created under the lock; rows of DEFAULT in its range moved into it).
    Returns how many were created. Attaching locks the DEFAULT partition, which a long read
    holds too: like `drop_older`, it gives up after `LOCK_TIMEOUT` (then the next pass,
    long before the month begins, makes it) rather than queue the reads behind it."""
    db.execute("SELECT pg_advisory_xact_lock(?)", (_LOCK,))
    db.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    existing = set(_partitions(db))
    year, month = month_of(min(moments))
    last = next_month(*month_of(max(moments)))
    created = 0
    while (year, month) <= last:
        if (year, month) not in existing:
            _create(db, year, month)
            created += 1
        year, month = next_month(year, month)
    return created


def _partitions(db: Any) -> list[tuple[int, int]]:
    rows = db.execute(
        "SELECT c.relname FROM pg_catalog.pg_inherits i "
        "JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'events'::regclass"
    ).fetchall()
    found = []
    for (name,) in rows:
        match = _MONTH.match(name)
        if match:
            found.append((int(match[1]), int(match[2])))
    return sorted(found)


def _create(db: Any, year: int, month: int) -> None:
    name = partition_name(year, month)
    start, end = bounds(year, month)
    db.execute(f"CREATE TABLE {name} (LIKE events INCLUDING DEFAULTS)")
    db.execute(
        f"WITH moved AS (DELETE FROM events_default WHERE received_at >= ? "  # noqa: S608
        f"AND received_at < ? RETURNING *) INSERT INTO {name} SELECT * FROM moved",
        (start, end),
    )
    db.execute(f"ALTER TABLE events ATTACH PARTITION {name} FOR VALUES FROM ({start}) TO ({end})")


def drop_older(db: Any, cutoff: float) -> int:
    """Drop every month partition that ends at or before `cutoff`; how many.

    Dropping a partition locks the whole audit log for an instant, but it must wait for the
    queries already running on it, and everything arriving meanwhile would queue behind
    it: `lock_timeout` makes it give up after two seconds instead (the next pass tries
    again) so a long export never turns into stalled ingest."""
    db.execute("SELECT pg_advisory_xact_lock(?)", (_LOCK,))
    db.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    dropped = 0
    for year, month in _partitions(db):
        if bounds(year, month)[1] <= cutoff:
            name = partition_name(year, month)
            (rows,) = db.execute(f"SELECT COUNT(*) FROM {name}").fetchone()  # noqa: S608
            db.execute(f"DROP TABLE {name}")
            tallies.bump(db, -int(rows), 0)  # the kept count of the audit log, in this transaction
            dropped += 1
    return dropped


def keys_cutoff(events_cutoff: float) -> float:
    """Keys of non-heartbeat events live until their month is dropped: the start of the
    month holding the cutoff (that month's partition is still there)."""
    return bounds(*month_of(events_cutoff))[0]


def prune_keys(db: Any, heartbeat: bool, cutoff: float, limit: int) -> int:
    """One batch of `event_keys` of heartbeats (or of the rest) received before `cutoff`."""
    cursor = db.execute(
        "DELETE FROM event_keys WHERE (source, id) IN (SELECT source, id FROM event_keys "
        "WHERE heartbeat = ? AND received_at < ? ORDER BY received_at LIMIT ?)",
        (heartbeat, cutoff, limit),
    )
    return int(cursor.rowcount)


def insert_events(db: Any, rows: Iterable[Sequence[Any]]) -> set[tuple[str, str]]:
    """Append the events `rows` (source, id, type, instance, notice_id, time, received_at,
    ingest, body) that `event_keys` did not hold yet, in their order; the (source, id) of
    those that were new."""
    unique: dict[tuple[str, str], Sequence[Any]] = {}
    for row in rows:
        unique.setdefault((row[0], row[1]), row)
    if not unique:
        return set()
    values = list(unique.values())
    new = db.execute(
        "INSERT INTO event_keys (source, id, received_at, heartbeat) "
        "SELECT s, i, r, t = ? FROM unnest(?::text[], ?::text[], ?::text[], ?::float8[]) "
        "AS k(s, i, t, r) ON CONFLICT (source, id) DO NOTHING RETURNING source, id",
        (
            _HEARTBEAT,
            [v[0] for v in values],
            [v[1] for v in values],
            [v[2] for v in values],
            [v[6] for v in values],
        ),
    ).fetchall()
    inserted = {(str(s), str(i)) for s, i in new}
    fresh = [v for key, v in unique.items() if key in inserted]
    if fresh:
        columns = list(zip(*fresh, strict=True))
        db.execute(
            f"INSERT INTO events ({EVENT_COLUMNS}) "  # noqa: S608 (constants)
            "SELECT s, i, t, n, nid, tm, r, g, b FROM unnest(?::text[], ?::text[], ?::text[], "
            "?::text[], ?::text[], ?::float8[], ?::float8[], ?::text[], ?::text[]) "
            "WITH ORDINALITY AS e(s, i, t, n, nid, tm, r, g, b, o) ORDER BY o",
            [list(c) for c in columns],
        )
    return inserted
