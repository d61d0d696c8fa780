"""The fleet store's schema versions and the runner that upgrades a database to the latest.

A store database records the steps applied to it in `schema_version` (one row per step:
its number, when, by which release). Opening a store for writing runs every step above the
database's version, each in ONE transaction with the row that records it, so a crash in a
step leaves the version before it and the next start runs that step again from scratch.

Version 1 is the schema as 0.2.0 created it (`bridge.fleet.sql.schema`, no
`schema_version` table; 0.2.0 also made the list indexes and the tallies, now steps 5 and
6): a database with an `events` table and no `schema_version` is taken as version 1 and
upgraded from there, so a store written by that release opens after the upgrade with its
events, notices, instances, counts, refused inputs and checkpoints as they were
(tests/fleet/test_migrations.py upgrades the fixtures that release's code wrote,
tests/fixtures/fleet-store-v1/).

A database of a NEWER version than this build knows is refused before anything is read or
written, with a message naming both versions: an older binary must not write rows that the
newer schema's rules (columns, partitions, de-duplication) would not see. Read-only opens
(`fleet status`, `fleet export`) never migrate: they refuse an older database too, asking
for one start of the service, whose queries are the current schema's.

Two replicas starting together migrate once: every step's transaction first takes the
database's write lock (PostgreSQL: `pg_advisory_xact_lock`; SQLite: `BEGIN IMMEDIATE`), then
reads the version again, so the second replica waits and finds the step done.

## Adding to the schema

- A new table or index can go into `bridge.fleet.sql.schema` with `CREATE ... IF NOT EXISTS`
  (what branches worked on in parallel did): those statements run after the numbered steps
  on every open, so new and upgraded databases both get them. Never change a statement
  there that an existing database already ran (a column added to a `CREATE TABLE` would
  reach new databases only).
- Anything else (a new column, a changed index, data moved) is a step: append
  `Step(N + 1, "what and why", sqlite=(...), postgres=(...))` to `STEPS` (or `run=` a
  function for a step that needs to compute, like `_partition_audit_log`; a step that one
  database does not need still takes its number there, doing nothing). To turn an `IF NOT EXISTS`
  addition into a step, copy its statement into the new step as is (it stays idempotent on
  the databases that already have it) and remove it from `sql.schema`. A step is never
  edited once released; a mistake is fixed by the next step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Final

from bridge import __version__
from bridge.fleet import partitions, sql, tallies
from bridge.fleet.store import StoreError

#: The table that records the applied steps.
VERSION_TABLE: Final = "schema_version"
_CREATE_VERSION_TABLE: Final = (
    f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} ("
    "version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL, "
    "release TEXT NOT NULL, summary TEXT NOT NULL)"
)
_HEARTBEAT: Final = "io.maintenancebridge.agent.heartbeat"  # bridge.contract.HEARTBEAT
log = logging.getLogger("bridge.fleet.store")


@dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between the databases for the runner: the name steps branch on, the
    serial column, how to ask whether a table exists, and the locked write transaction."""

    name: str
    serial: str
    #: A query with one `?` (the table name) returning a row with a non-NULL value if it exists.
    table_exists: str
    #: `with transaction(db):` one locked write transaction on `db`, rolled back on error.
    transaction: Callable[[Any], AbstractContextManager[None]]


@contextmanager
def _sqlite_transaction(db: Any) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")  # the database's write lock, held until COMMIT
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


@contextmanager
def _postgres_transaction(db: Any) -> Iterator[None]:
    with db.connection.transaction():
        db.execute("SELECT pg_advisory_xact_lock(?)", (sql.POSTGRES_SCHEMA_LOCK,))
        yield


SQLITE: Final = Dialect(
    "sqlite",
    sql.SQLITE_SERIAL,
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?",
    _sqlite_transaction,
)
#: A scan of pg_class, not `to_regclass`: that reads the backend's catalog cache, which an
#: advisory lock does not refresh, so a replica would miss the tables another just created.
POSTGRES: Final = Dialect(
    "postgresql",
    sql.POSTGRES_SERIAL,
    "SELECT relname FROM pg_catalog.pg_class WHERE relname = ? "
    "AND relnamespace = current_schema()::regnamespace",
    _postgres_transaction,
)


@dataclass(frozen=True, slots=True)
class Step:
    """One schema change: its number, why, and the statements per dialect (or `run`)."""

    version: int
    summary: str
    sqlite: Sequence[str] = ()
    postgres: Sequence[str] = ()
    #: Instead of fixed statements: `run(db, dialect)` inside the step's transaction.
    run: Callable[[Any, Dialect], None] | None = None

    def apply(self, db: Any, dialect: Dialect) -> None:
        if self.run is not None:
            self.run(db, dialect)
            return
        for statement in self.sqlite if dialect is SQLITE else self.postgres:
            db.execute(statement)


def _v1(db: Any, dialect: Dialect) -> None:
    for statement in sql.schema(dialect.serial):
        db.execute(statement)
    # 0.2.0's index of event names, left out of `sql.schema` since step 12 dropped it: made
    # here as that release made it, so the steps between see the tables they were written for.
    db.execute(_EVENT_NAMES)


_EVENT_NAMES: Final = "CREATE INDEX IF NOT EXISTS events_instance ON events (instance)"
_RETENTION: Final = (
    # Retired, not deleted: the instance stays listed, marked, until it is heard from again.
    "ALTER TABLE instances ADD COLUMN retired_at DOUBLE PRECISION",
    # Heartbeats are pruned long before the rest of the audit log: find them by age.
    "CREATE INDEX IF NOT EXISTS events_heartbeat_received ON events (received_at) "
    f"WHERE type = '{_HEARTBEAT}'",
)

#: `bridge.fleet.sources.eventhubs_ownership`: who reads which partition of a hub.
_OWNERS: Final = (
    "CREATE TABLE IF NOT EXISTS partition_owners (namespace TEXT NOT NULL, "
    "eventhub TEXT NOT NULL, consumer_group TEXT NOT NULL, partition_id TEXT NOT NULL, "
    "owner_id TEXT NOT NULL, last_modified DOUBLE PRECISION NOT NULL, etag TEXT NOT NULL, "
    "PRIMARY KEY (namespace, eventhub, consumer_group, partition_id))",
)


def _attested(db: Any, dialect: Dialect) -> None:
    """Per instance: were its latest events attested (#34; 1, 0, or NULL where no source
    checks identity), and the partial index the counts and the list's filter read. The
    column is added only where it is missing, so the step can be run again."""
    if dialect is POSTGRES:
        db.execute("ALTER TABLE instances ADD COLUMN IF NOT EXISTS attested INTEGER")
    elif "attested" not in {row[1] for row in db.execute("PRAGMA table_info(instances)")}:
        db.execute("ALTER TABLE instances ADD COLUMN attested INTEGER")
    db.execute(
        "CREATE INDEX IF NOT EXISTS instances_attested ON instances (attested, name, source) "
        "WHERE attested IS NOT NULL"
    )


def _partition_audit_log(db: Any, dialect: Dialect) -> None:
    """PostgreSQL only: the audit log partitioned by month, idempotence in `event_keys`
    (`bridge.fleet.partitions`). SQLite deletes in batches instead and keeps its table."""
    if dialect is POSTGRES:
        partitions.step(db, time.time())


def _tallies(db: Any, dialect: Dialect) -> None:
    """The counts kept as events arrive (`bridge.fleet.tallies`): created and filled from
    the rows once; a store whose release kept them already keeps its figures."""
    if dialect is POSTGRES:
        tallies.prepare(db, tallies.postgres_ddl(), tallies.POSTGRES_FILL_LOCK, postgres=True)
    else:
        tallies.prepare(db, tallies.sqlite_ddl())


#: The filtered lists' orders (`bridge.fleet.reads`): a zone's notices in force and a zone's
#: instances are an index seek and a page, not a walk of every row checking the zone.
_FILTERED_LISTS: Final = (
    "CREATE INDEX IF NOT EXISTS notices_zone_order ON notices "
    "(zone, (COALESCE(not_before, 9e18)), time, source, notice_id) WHERE rank < 2",
    "CREATE INDEX IF NOT EXISTS instances_zone_order ON instances (zone, name, source)",
)
#: PostgreSQL's index of the instance search (`q`, a part of the name): trigrams, which
#: `ILIKE '%part%'` uses for parts of three characters or more.
TRIGRAM_INDEX: Final = (
    "CREATE INDEX IF NOT EXISTS instances_name_trgm ON instances USING gin (name gin_trgm_ops)"
)


def _search_indexes(db: Any, dialect: Dialect) -> None:
    """The filtered lists' indexes and, on PostgreSQL with the `pg_trgm` extension (in
    `postgresql-contrib`, trusted: a database owner may create it), the trigram index of
    the instance search. Without the extension the search still works, as a scan of the
    names (about 100 ms at 100,000 instances); a warning says how to add the index."""
    for statement in _FILTERED_LISTS:
        db.execute(statement)
    if dialect is not POSTGRES:
        return  # SQLite: a scan of the (name, source) index, no table rows read
    import psycopg  # only ever here with the PostgreSQL store, which imported it

    try:
        with db.connection.transaction():  # a savepoint: a refusal leaves the step going
            db.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
            db.execute(TRIGRAM_INDEX)
    except psycopg.Error as exc:
        log.warning(
            "fleet store: no trigram index for the instance search (%s); searches scan the "
            "names. To add it: CREATE EXTENSION pg_trgm (as a superuser if the database owner "
            "may not), then %s",
            " ".join(str(exc).split()),
            TRIGRAM_INDEX,
        )


def _retired_by_group(db: Any, dialect: Dialect) -> None:
    """Retired instances counted per provider, version and zone (the page's rows)."""
    tallies.regroup_retired(db, postgres=dialect is POSTGRES)


#: `?state=retired` pages through an index of the retired instances (#33), not a walk of
#: every name checking each.
_RETIRED_INDEX: Final = (
    "CREATE INDEX IF NOT EXISTS instances_retired ON instances (name, source) "
    "WHERE retired_at IS NOT NULL"
)
#: SQLite: the audit log's index of each notice's history leaves out the events of no
#: notice (heartbeats, most of the log, each an entry at a random place of it that no
#: read looked for; the histories' join on `notice_id` implies the condition). PostgreSQL
#: keeps it whole: its partitioned audit log has no (source, id) key, and this index is
#: what finds an instance's events by source.
_SQLITE_NOTICE_INDEX: Final = (
    "DROP INDEX IF EXISTS events_notice",
    "CREATE INDEX IF NOT EXISTS events_notice ON events (source, notice_id) "
    "WHERE notice_id IS NOT NULL",
)


def _cheaper_writes(db: Any, dialect: Dialect) -> None:
    """Step 10: the indexes above, and the silent instances' trigger narrowed to what the
    heartbeat writer does not count itself (`bridge.fleet.tallies.silent_moves`)."""
    for statement in (*(_SQLITE_NOTICE_INDEX if dialect is SQLITE else ()), _RETIRED_INDEX):
        db.execute(statement)
    tallies.narrow_silent_trigger(db, postgres=dialect is POSTGRES)


#: SQLite's index of the instance search (`q`, a part of the name): an FTS5 table of the
#: names tokenized in trigrams (SQLite >= 3.34, built with FTS5), one row per instance
#: under the instance's rowid, kept in step by triggers in the writer's transaction (an
#: instance is inserted once and its name rarely changes: the heartbeats' upserts leave it
#: alone). `bridge.fleet.reads` searches `instances_search` for parts of three characters
#: or more.
_SQLITE_SEARCH: Final = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS instances_search USING fts5(name, tokenize='trigram')",
    "INSERT INTO instances_search (rowid, name) SELECT rowid, name FROM instances",
    "CREATE TRIGGER IF NOT EXISTS instances_search_insert AFTER INSERT ON instances "
    "BEGIN INSERT INTO instances_search (rowid, name) VALUES (NEW.rowid, NEW.name); END",
    "CREATE TRIGGER IF NOT EXISTS instances_search_rename AFTER UPDATE OF name ON instances "
    "WHEN OLD.name IS NOT NEW.name BEGIN UPDATE instances_search SET name = NEW.name "
    "WHERE rowid = NEW.rowid; END",
    "CREATE TRIGGER IF NOT EXISTS instances_search_delete AFTER DELETE ON instances "
    "BEGIN DELETE FROM instances_search WHERE rowid = OLD.rowid; END",
)


def _sqlite_search(db: Any, dialect: Dialect) -> None:
    """SQLite only (PostgreSQL has its trigram index since step 8): the FTS5 trigram table
    of the instance names, filled from the instances and kept by triggers. A SQLite built
    without FTS5, or older than 3.34 (no trigram tokenizer), keeps searching by a scan of
    the names, as before, and says so once at the upgrade; the step is recorded either way.
    Run again (a store whose later steps were undone), it keeps the table it made."""
    if dialect is POSTGRES:
        return
    import sqlite3  # only ever here with the SQLite store

    if _exists(db, dialect, "instances_search"):
        return  # made by an earlier run of this step, kept since by its triggers
    try:
        db.execute("SAVEPOINT search_table")
        for statement in _SQLITE_SEARCH:
            db.execute(statement)
        db.execute("RELEASE search_table")
    except sqlite3.OperationalError as exc:
        db.execute("ROLLBACK TO search_table")
        db.execute("RELEASE search_table")
        log.warning(
            "fleet store: SQLite %s cannot make the instance search's index (%s: FTS5 with "
            "the trigram tokenizer needs SQLite 3.34 or later, built with FTS5); searches "
            "by a part of a name scan the names (about 30 ms at 100,000 instances)",
            sqlite3.sqlite_version,
            exc,
        )


#: The audit log's index of event names: written at a random place for every event (a page
#: of the write-ahead log per event on SQLite, an index insert per event on PostgreSQL), for
#: one read, an instance's audit log, which now finds the instance's sources in `instances`
#: and their events through the audit log's source-first indexes (`bridge.fleet.reads`).
#: New databases never make it (it left `sql.schema`); older ones drop it here.
_NO_EVENT_NAMES: Final = ("DROP INDEX IF EXISTS events_instance",)

#: Every step, in order; the last one's number is the schema this build writes. Steps 5
#: and 6 are what 0.2.0 created with `IF NOT EXISTS` at every open
#: (its stores have them already: their statements are idempotent, so they find them done).
STEPS: Final[tuple[Step, ...]] = (
    Step(1, "the tables of 0.2.0", run=_v1),
    Step(2, "retention: instances.retired_at, heartbeats by age", _RETENTION, _RETENTION),
    Step(3, "audit log partitioned by month, de-duplication keys", run=_partition_audit_log),
    Step(4, "Event Hubs partition ownership shared by replicas", _OWNERS, _OWNERS),
    Step(5, "indexes of the paged lists", sql.READ_INDEXES, sql.READ_INDEXES),
    Step(6, "counts kept as events arrive", run=_tallies),
    Step(7, "instances: whether their latest events were attested", run=_attested),
    Step(8, "indexes of the filtered lists and the instance search", run=_search_indexes),
    Step(9, "retired instances counted by provider, version and zone", run=_retired_by_group),
    Step(10, "cheaper heartbeats; retired instances indexed", run=_cheaper_writes),
    Step(11, "SQLite: the instance search's trigram index (FTS5)", run=_sqlite_search),
    Step(12, "cheaper events: no index of the audit log by name", _NO_EVENT_NAMES, _NO_EVENT_NAMES),
)
LATEST: Final = STEPS[-1].version


def current_version(db: Any, dialect: Dialect) -> int:
    """The database's schema version: 0 when it is empty, 1 when 0.2.0 wrote it."""
    if _exists(db, dialect, VERSION_TABLE):
        (version,) = db.execute(f"SELECT MAX(version) FROM {VERSION_TABLE}").fetchone()  # noqa: S608
        if version is not None:
            return int(version)
    return 1 if _exists(db, dialect, "events") else 0


def _exists(db: Any, dialect: Dialect, table: str) -> bool:
    row = db.execute(dialect.table_exists, (table,)).fetchone()
    return row is not None and row[0] is not None


def refuse_newer(version: int, where: str, latest: int = LATEST) -> None:
    """Raise `StoreError` when `version` is newer than this build's schema (`latest`)."""
    if version > latest:
        raise StoreError(
            f"the fleet store {where} has schema version {version}, newer than this "
            f"maintenance-bridge {__version__} knows (up to version {latest}): run the "
            "release that upgraded it (or a later one), or restore the backup taken before "
            "that upgrade"
        )


def check(db: Any, dialect: Dialect, where: str) -> None:
    """For a read-only open: the database is at this build's version, else `StoreError`."""
    version = current_version(db, dialect)
    refuse_newer(version, where)
    if version < LATEST:
        raise StoreError(
            f"the fleet store {where} has schema version {version}, this maintenance-bridge "
            f"{__version__} reads version {LATEST}: start `maintenance-bridge fleet` once "
            "to upgrade it"
        )


def upgrade(db: Any, dialect: Dialect, where: str, *, steps: Sequence[Step] = STEPS) -> list[int]:
    """Run every step above the database's version, each in its own locked transaction;
    then the idempotent `sql.schema` additions. Returns the versions this call applied
    (empty when another replica, or an earlier start, did them)."""
    latest = steps[-1].version
    refuse_newer(current_version(db, dialect), where, latest)
    applied = []
    for step in steps:
        with dialect.transaction(db):
            version = current_version(db, dialect)  # again, under the lock
            refuse_newer(version, where, latest)
            if version >= step.version:
                continue
            db.execute(_CREATE_VERSION_TABLE)
            if version == 1 and step.version == 2 and not _recorded(db):
                _record(db, Step(1, "the tables of 0.2.0 (found unversioned)"))
            step.apply(db, dialect)
            _record(db, step)
            applied.append(step.version)
    with dialect.transaction(db):
        for statement in sql.schema(dialect.serial):
            db.execute(statement)
    return applied


def _recorded(db: Any) -> bool:
    return db.execute(f"SELECT 1 FROM {VERSION_TABLE} LIMIT 1").fetchone() is not None  # noqa: S608


def _record(db: Any, step: Step) -> None:
    db.execute(
        f"INSERT INTO {VERSION_TABLE} (version, applied_at, release, summary) "  # noqa: S608
        "VALUES (?, ?, ?, ?)",
        (step.version, time.time(), __version__, step.summary),
    )
