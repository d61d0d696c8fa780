"""The fleet store's tables and statements, in the SQL that SQLite and PostgreSQL both speak.

Placeholders are `?` (sqlite3's qmark style); a PostgreSQL driver gets them rewritten to `%s`
by `to_pyformat`. Times are REAL/DOUBLE PRECISION Unix seconds, so comparisons and
`CASE WHEN a > b` work the same in both (there is no two-argument `MAX` in PostgreSQL).
Only the DDL differs: the sequence column of `events` and `rejected` (`INTEGER PRIMARY KEY`
here, `BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY` there) and BLOB vs BYTEA is avoided
by keeping bodies as TEXT (events are UTF-8 JSON).
"""

from __future__ import annotations

from typing import Final

from bridge.infra.sqlparams import marks

#: Serial key column, per dialect.
SQLITE_SERIAL: Final = "INTEGER PRIMARY KEY"
POSTGRES_SERIAL: Final = "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
#: PostgreSQL's advisory lock of schema changes (any constant): replicas starting together
#: migrate one at a time under it, and partitions are made and dropped under it.
POSTGRES_SCHEMA_LOCK: Final = 0x6D62_666C_6565_7401


def schema(serial: str) -> list[str]:
    """CREATE statements (idempotent) with the dialect's serial key column."""
    return [
        # The audit log: append-only, one row per (source, id), the exact bytes received.
        f"""CREATE TABLE IF NOT EXISTS events (
            seq {serial},
            source TEXT NOT NULL,
            id TEXT NOT NULL,
            type TEXT NOT NULL,
            instance TEXT NOT NULL,
            notice_id TEXT,
            time DOUBLE PRECISION NOT NULL,
            received_at DOUBLE PRECISION NOT NULL,
            ingest TEXT NOT NULL,
            body TEXT NOT NULL,
            UNIQUE (source, id)
        )""",
        "CREATE INDEX IF NOT EXISTS events_notice ON events (source, notice_id)",
        "CREATE INDEX IF NOT EXISTS events_time ON events (time)",
        """CREATE TABLE IF NOT EXISTS instances (
            source TEXT PRIMARY KEY,
            provider TEXT NOT NULL,
            name TEXT NOT NULL,
            instance_id TEXT NOT NULL,
            zone TEXT,
            location TEXT,
            project TEXT,
            subscription TEXT,
            resource_group TEXT,
            scale_set TEXT,
            resource_id TEXT NOT NULL,
            first_seen DOUBLE PRECISION NOT NULL,
            last_seen DOUBLE PRECISION NOT NULL,
            last_heartbeat DOUBLE PRECISION,
            heartbeat_interval DOUBLE PRECISION,
            agent_version TEXT,
            watcher_healthy INTEGER,
            spool_depth INTEGER,
            started_at DOUBLE PRECISION
        )""",
        "CREATE INDEX IF NOT EXISTS instances_name ON instances (name)",
        """CREATE TABLE IF NOT EXISTS notices (
            source TEXT NOT NULL,
            notice_id TEXT NOT NULL,
            provider TEXT NOT NULL,
            instance TEXT NOT NULL,
            zone TEXT,
            kind TEXT NOT NULL,
            status TEXT NOT NULL,
            rank INTEGER NOT NULL,
            time DOUBLE PRECISION NOT NULL,
            not_before DOUBLE PRECISION,
            event_id TEXT NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (source, notice_id)
        )""",
        "CREATE INDEX IF NOT EXISTS notices_rank ON notices (rank)",
        "CREATE INDEX IF NOT EXISTS notices_instance ON notices (instance)",
        f"""CREATE TABLE IF NOT EXISTS rejected (
            seq {serial},
            ingest TEXT NOT NULL,
            received_at DOUBLE PRECISION NOT NULL,
            reason TEXT NOT NULL,
            body TEXT NOT NULL
        )""",
        # One row, rewritten by each readiness probe: ready means the store can commit.
        """CREATE TABLE IF NOT EXISTS readiness (
            id INTEGER PRIMARY KEY,
            checked DOUBLE PRECISION NOT NULL
        )""",
        """CREATE TABLE IF NOT EXISTS checkpoints (
            ingest TEXT NOT NULL,
            part TEXT NOT NULL,
            position TEXT NOT NULL,
            updated DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (ingest, part)
        )""",
    ]


#: Indexes of the API's paged lists (`bridge.fleet.paging`): each list's keyset order, so a
#: page is an index seek and `limit` rows. The notices' order is
#: `bridge.fleet.reads.NOTICE_ORDER` written without the table alias (both planners match it).
READ_INDEXES: Final = (
    "CREATE INDEX IF NOT EXISTS notices_order ON notices "
    "((COALESCE(not_before, 9e18)), time, source, notice_id) WHERE rank < 2",
    "CREATE INDEX IF NOT EXISTS instances_order ON instances (name, source)",
    # The page's timeline reads a week of maintenance events, not a week of heartbeats.
    "CREATE INDEX IF NOT EXISTS events_type_time ON events (type, time)",
)


INSERT_EVENT: Final = (
    "INSERT INTO events (source, id, type, instance, notice_id, time, received_at, ingest, body) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (source, id) DO NOTHING"
)

INSTANCE_COLUMNS: Final = (
    "source, provider, name, instance_id, zone, location, project, subscription, "
    "resource_group, scale_set, resource_id, first_seen, last_seen, attested"
)
#: The heartbeat's columns of an instance row (NULL in a row of a transaction that holds
#: no heartbeat of its VM).
HEARTBEAT_COLUMNS: Final = (
    "last_heartbeat", "heartbeat_interval", "agent_version", "watcher_healthy", "spool_depth",
    "started_at",
)  # fmt: skip
#: What an instance upsert does with a row already there: its times and the retired mark,
#: columns no index of `instances` holds except the partial one of retired instances. An
#: UPDATE that names an indexed column rewrites that column's index entries even when the
#: value stays the same (SQLite), so the identity, which next to never changes, is set
#: apart (`UPDATE_IDENTITY`), only where it differs: every event of a VM costs a write of
#: its row, not also of the name, zone and attestation indexes.
INSTANCE_TIMES: Final = (
    "first_seen = CASE WHEN excluded.first_seen < instances.first_seen "
    "THEN excluded.first_seen ELSE instances.first_seen END, "
    "last_seen = CASE WHEN excluded.last_seen > instances.last_seen "
    "THEN excluded.last_seen ELSE instances.last_seen END, "
    # Heard from again (a newer event, not a late old one): no longer retired.
    "retired_at = CASE WHEN excluded.last_seen > instances.last_seen "
    "THEN NULL ELSE instances.retired_at END"
)
#: The heartbeat folded into the same upsert, so a heartbeat writes its instance row once
#: (one row version on PostgreSQL, one B-tree rewrite on SQLite): a later heartbeat only
#: (one delivered late never makes a dead sidecar look alive; a tie goes to the later one,
#: as applying them in order leaves it), and none at all when the row carries none.
HEARTBEAT_LATER: Final = (
    "excluded.last_heartbeat IS NOT NULL AND (instances.last_heartbeat IS NULL "
    "OR instances.last_heartbeat <= excluded.last_heartbeat)"
)
INSTANCE_HEARTBEAT: Final = ", ".join(
    f"{c} = CASE WHEN {HEARTBEAT_LATER} THEN excluded.{c} ELSE instances.{c} END"
    for c in HEARTBEAT_COLUMNS
)
#: The identity of the upsert's row (and the attestation of its latest events).
INSTANCE_IDENTITY: Final = (
    "provider", "name", "instance_id", "zone", "location", "project", "subscription",
    "resource_group", "scale_set", "resource_id", "attested",
)  # fmt: skip
#: The whole upsert in one statement, for PostgreSQL's multi-row form
#: (`bridge.fleet.postgres_store`): PostgreSQL compares the values of indexed columns, so
#: an identity (or a heartbeat) set to what it was leaves the indexes alone (a HOT update,
#: when the page has room).
INSTANCE_CONFLICT: Final = (
    "ON CONFLICT (source) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in INSTANCE_IDENTITY)
    + f", {INSTANCE_TIMES}, {INSTANCE_HEARTBEAT}"
)
#: The columns of an instance row with its heartbeat (`bridge.fleet.writes.InstanceRow`).
INSTANCE_HEARTBEAT_COLUMNS: Final = f"{INSTANCE_COLUMNS}, {', '.join(HEARTBEAT_COLUMNS)}"
#: SQLite, an instance of no heartbeat in the transaction (the row's first 14 columns): the
#: heartbeat's columns are left out, so the index of when it turns silent is not rewritten.
UPSERT_INSTANCE: Final = (
    f"INSERT INTO instances ({INSTANCE_COLUMNS}) "  # noqa: S608 (constants)
    f"VALUES ({marks(14)}) "
    f"ON CONFLICT (source) DO UPDATE SET {INSTANCE_TIMES}"
)
#: SQLite, an instance with its latest heartbeat of the transaction (the whole row).
UPSERT_INSTANCE_HEARTBEAT: Final = (
    f"INSERT INTO instances ({INSTANCE_HEARTBEAT_COLUMNS}) "  # noqa: S608 (constants)
    f"VALUES ({marks(20)}) "
    f"ON CONFLICT (source) DO UPDATE SET {INSTANCE_TIMES}, {INSTANCE_HEARTBEAT}"
)
#: After `UPSERT_INSTANCE`, with the same row's first 14 columns (numbered parameters: `?1`
#: is the source, the identity follows in `INSTANCE_COLUMNS` order, `?14` the
#: attestation): the identity where it differs (SQLite's null-safe `IS NOT`), else nothing
#: is written.
UPDATE_IDENTITY: Final = (
    "UPDATE instances SET "  # noqa: S608 (constants)
    + ", ".join(f"{c} = ?{n}" for n, c in enumerate(INSTANCE_IDENTITY[:-1], 2))
    + ", attested = ?14 WHERE source = ?1 AND ("
    + " OR ".join(f"{c} IS NOT ?{n}" for n, c in enumerate(INSTANCE_IDENTITY[:-1], 2))
    + " OR attested IS NOT ?14)"
)

NOTICE_COLUMNS: Final = (
    "source, notice_id, provider, instance, zone, kind, status, rank, time, not_before, "
    "event_id, body"
)
#: The forward-only rule of `bridge.fleet.state.newer`, as a conditional upsert.
NOTICE_CONFLICT: Final = (
    "ON CONFLICT (source, notice_id) DO UPDATE SET "
    "provider = excluded.provider, instance = excluded.instance, zone = excluded.zone, "
    "kind = excluded.kind, status = excluded.status, rank = excluded.rank, "
    "time = excluded.time, not_before = excluded.not_before, event_id = excluded.event_id, "
    "body = excluded.body "
    "WHERE notices.rank < 2 AND (excluded.rank > notices.rank "
    "OR (excluded.rank = notices.rank AND excluded.time >= notices.time))"
)
UPSERT_NOTICE: Final = (
    f"INSERT INTO notices ({NOTICE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "  # noqa: S608
    f"{NOTICE_CONFLICT}"
)

INSERT_REJECTED: Final = (
    "INSERT INTO rejected (ingest, received_at, reason, body) VALUES (?, ?, ?, ?)"
)

UPSERT_CHECKPOINT: Final = (
    "INSERT INTO checkpoints (ingest, part, position, updated) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (ingest, part) DO UPDATE SET position = excluded.position, "
    "updated = excluded.updated"
)


def to_pyformat(statement: str) -> str:
    """The statement with `%s` placeholders (psycopg, asyncpg via its own `$n` rewrite)."""
    return statement.replace("%", "%%").replace("?", "%s")


#: The readiness probe's write (`Store.ping`): a commit, not only an answer.
PROBE: Final = (
    "INSERT INTO readiness (id, checked) VALUES (1, ?) "
    "ON CONFLICT (id) DO UPDATE SET checked = excluded.checked"
)
