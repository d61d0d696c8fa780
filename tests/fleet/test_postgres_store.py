"""The PostgreSQL store as users run it: a connection pool that gets over a broken
connection, statements prepared once per connection, and read queries that use indexes at
a realistic size (checked with EXPLAIN).

A real PostgreSQL server (tests/fleet/postgres_server.py: skipped without its binaries,
failing under CI=true).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from bridge.fleet import partitions, sql
from bridge.fleet.postgres_store import READERS, PostgresStore
from bridge.fleet.reads import Reads
from bridge.fleet.retention import DAY, prune_heartbeats, retire_silent
from bridge.fleet.store import EventQuery, InstanceQuery, NoticeFilter, StoreError
from tests.fleet.factories import batch, gce_vm, heartbeat

pytest_plugins = ["tests.fleet.postgres_server"]

#: The size the plans are checked at: enough rows that a scan of a whole table costs more
#: than its index (a plan at ten rows says nothing), small enough to fill in seconds.
INSTANCES = 20_000
EVENTS = 300_000


@pytest.fixture
def store(postgres_store: PostgresStore) -> PostgresStore:
    return postgres_store


async def test_a_broken_connection_fails_one_call_and_the_next_one_works(
    store: PostgresStore,
) -> None:
    await store.ingest(batch(heartbeat(gce_vm("web-1"), time_now())))
    with psycopg.connect(store.url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'maintenance-bridge-fleet'"
        )
    outcomes: list[int | str] = []
    for _ in range(READERS + 3):  # every pooled connection was cut: each fails once at most
        try:
            outcomes.append((await store.counts())["events"])
        except StoreError as exc:
            outcomes.append(str(exc))
    failures = [o for o in outcomes if isinstance(o, str)]
    assert all("terminat" in o or "closed" in o for o in failures), failures
    assert outcomes[-1] == 1


async def test_the_statements_of_ingest_are_prepared_once_per_connection(
    store: PostgresStore,
) -> None:
    vm = gce_vm("web-1")
    for sequence in range(12):
        await store.ingest(batch(heartbeat(vm, time_now(), sequence=sequence)))
    prepared: set[str] = set()
    for _ in range(READERS + 1):  # the pool hands its connections out in turn
        rows = await store.transaction(
            lambda db: db.execute("SELECT statement FROM pg_prepared_statements").fetchall()
        )
        prepared |= {str(statement) for (statement,) in rows}
    assert any(s.startswith("INSERT INTO event_keys") for s in prepared), prepared
    assert any(s.startswith("INSERT INTO events") for s in prepared), prepared


def time_now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


# -- plans ----------------------------------------------------------------------------------


class Capture:
    """A `?`-placeholder connection that records each statement a query runs, so the plans
    checked are those of `Reads` as it is, whatever its SQL becomes."""

    #: As the store's adapter says (`Reads` asks SQLite alone some questions).
    postgres = True

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self.connection = connection
        self.statements: list[tuple[str, list[Any]]] = []

    def execute(self, statement: str, params: Any = ()) -> psycopg.Cursor[Any]:
        # As the store's adapter sends it (`%s` placeholders, ILIKE).
        statement = sql.to_pyformat(statement.replace(" LIKE ", " ILIKE "))
        self.statements.append((statement, list(params)))
        return self.connection.execute(statement.encode(), list(params))


def fill(connection: psycopg.Connection[Any]) -> None:
    """A fleet of `INSTANCES` VMs with `EVENTS` events (nine in ten heartbeats), a notice per
    VM of which one in twenty is in force, written straight in SQL (the store's rules are
    not what is measured here, the plans are)."""
    now = time.time()
    for statement in (
        "INSERT INTO instances (source, provider, name, instance_id, zone, resource_id, "  # noqa: S608
        "first_seen, last_seen) SELECT 'src-' || i, 'gce', 'vm-' || i, i::text, "
        f"'zone-' || (i % 50), 'r-' || i, {now}, {now} "
        f"FROM generate_series(1, {INSTANCES}) AS i",
        "INSERT INTO notices (source, notice_id, provider, instance, zone, kind, status, rank, "  # noqa: S608
        "time, event_id, body) SELECT 'src-' || i, 'n-' || i, 'gce', 'vm-' || i, "
        "'zone-' || (i % 50), 'reboot', CASE WHEN i % 20 = 0 THEN 'scheduled' "
        "ELSE 'completed' END, CASE WHEN i % 20 = 0 THEN 0 ELSE 2 END, "
        f"{now}, 'e-' || i, '{{\"data\": {{\"window\": null}}}}' "
        f"FROM generate_series(1, {INSTANCES}) AS i",
        "INSERT INTO events (source, id, type, instance, notice_id, time, received_at, ingest, "  # noqa: S608
        f"body) SELECT 'src-' || (i % {INSTANCES}), 'e-' || i, "
        "CASE WHEN i % 10 = 0 THEN 'io.maintenancebridge.maintenance.scheduled' "
        "ELSE 'io.maintenancebridge.agent.heartbeat' END, "
        f"'vm-' || (i % {INSTANCES}), CASE WHEN i % 10 = 0 THEN 'n-' || (i % {INSTANCES}) END, "
        f"{now} - i, {now} - i / 100.0, 'http', '{{}}' FROM generate_series(1, {EVENTS}) AS i",
        "INSERT INTO event_keys (source, id, received_at, heartbeat) "
        "SELECT source, id, received_at, type LIKE '%heartbeat' FROM events",
        # What autovacuum does on a live store: the trigram index's pending list (its
        # inserts, batched) merged, without which the planner prices it out.
        "VACUUM instances",
        "ANALYZE",
    ):
        connection.execute(statement.encode())


def scans(plan: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(node type, relation) of every scan in an EXPLAIN (FORMAT JSON) plan."""
    if "Relation Name" in plan:
        yield plan["Node Type"], plan["Relation Name"]
    for child in plan.get("Plans", []):
        yield from scans(child)


def large(connection: psycopg.Connection[Any]) -> set[str]:
    """The tables (and partitions) holding many rows: an empty partition (next month's, the
    DEFAULT one) is scanned at no cost, and the planner rightly does."""
    rows = connection.execute(
        b"SELECT relname FROM pg_class WHERE relkind = 'r' AND reltuples >= 10000"
    ).fetchall()
    return {str(name) for (name,) in rows}


QUERIES: dict[str, Callable[[Any], Any]] = {
    "one instance's notices (eligible)": lambda db: Reads.notices(
        db, NoticeFilter(instance="vm-4000"), True
    ),
    "notices in force": lambda db: Reads.notices(db, NoticeFilter(), True),
    "notices of one zone": lambda db: Reads.notices(db, NoticeFilter(zone="zone-7"), True),
    "instances by name (eligible)": lambda db: Reads.instances(db, ["vm-1", "vm-2"]),
    "instances and their notices in force (eligible)": lambda db: Reads.instances_in_force(
        db, ["vm-1", "vm-2", "vm-4000"]
    ),
    "a page of notices in force": lambda db: Reads.notice_page(db, NoticeFilter(), None, 100, None),
    "a page of one zone's notices": lambda db: Reads.notice_page(
        db, NoticeFilter(zone="zone-7"), None, 100, None
    ),
    "upcoming, time unknown": lambda db: Reads.notice_page(
        db, NoticeFilter(status="scheduled"), None, 100, "unknown"
    ),
    "a page of instances": lambda db: Reads.instance_page(db, InstanceQuery(limit=100)),
    "a page of one zone's instances": lambda db: Reads.instance_page(
        db, InstanceQuery(zone="zone-7", limit=100)
    ),
    "a page of retired instances": lambda db: Reads.instance_page(
        db, InstanceQuery(state="retired", limit=100)
    ),
    "instances whose name holds a part (trigrams)": lambda db: Reads.instance_page(
        db, InstanceQuery(search="m-1234", limit=100)
    ),
    "audit log page after a cursor": lambda db: Reads.events(db, EventQuery(cursor=290_000)),
    "one instance's audit log": lambda db: Reads.events(db, EventQuery(instance="vm-17")),
    # Retention's batches run beside ingest: they must find their rows by index too.
    "retention: a batch of heartbeats": lambda db: prune_heartbeats(db, time.time() - DAY, 1000),
    "retention: a batch of heartbeat keys": lambda db: partitions.prune_keys(
        db, True, time.time() - DAY, 1000
    ),
    "retention: a walk of the instances": lambda db: retire_silent(
        db, time.time() - 1000 * DAY, time.time(), "", 1000
    ),
}


async def test_the_read_queries_use_indexes_at_a_realistic_size(store: PostgresStore) -> None:
    with psycopg.connect(store.url, autocommit=True) as connection:
        fill(connection)
        big = large(connection)
        assert {"event_keys", "notices", "instances"} <= big
        for name, query in QUERIES.items():
            capture = Capture(connection)
            query(capture)
            assert capture.statements, name
            for statement, params in capture.statements:
                explained = connection.execute(
                    ("EXPLAIN (FORMAT JSON) " + statement).encode(), params
                ).fetchone()
                assert explained is not None
                (plan,) = explained
                seq_scans = [r for node, r in scans(plan[0]["Plan"]) if node == "Seq Scan"]
                assert not [r for r in seq_scans if r in big], (name, statement, plan)
        # The search by a part of the name: the trigram index (migration step 8), not a
        # scan of every name.
        capture = Capture(connection)
        QUERIES["instances whose name holds a part (trigrams)"](capture)
        statement, params = capture.statements[0]
        explained = connection.execute(
            ("EXPLAIN (FORMAT JSON) " + statement).encode(), params
        ).fetchone()
        assert explained is not None
        (plan,) = explained
        assert "instances_name_trgm" in set(indexes(plan[0]["Plan"])), plan


def indexes(plan: dict[str, Any]) -> Iterator[str]:
    """The names of the indexes an EXPLAIN (FORMAT JSON) plan reads."""
    if "Index Name" in plan:
        yield plan["Index Name"]
    for child in plan.get("Plans", []):
        yield from indexes(child)


async def test_without_pg_trgm_the_store_opens_and_the_search_scans_the_names(
    postgres_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A role that may not create the extension (no CREATE on its database): schema step 8
    makes the other indexes, logs how to add the trigram one, and a search still finds its
    instances, by a scan of the names."""
    role = f"plain_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_server.url(), autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN".encode())
        admin.execute(f"CREATE DATABASE {role}".encode())  # owned by the superuser
    with psycopg.connect(postgres_server.url(role), autocommit=True) as admin:
        admin.execute(f"GRANT CREATE ON SCHEMA public TO {role}".encode())
    store = PostgresStore(f"postgresql://{role}@127.0.0.1:{postgres_server.port}/{role}")
    with caplog.at_level(logging.WARNING, "bridge.fleet.store"):
        await store.open()
    try:
        assert "no trigram index for the instance search" in caplog.text
        assert "CREATE EXTENSION pg_trgm" in caplog.text
        await store.ingest(batch(heartbeat(gce_vm("web-1234"), time_now())))
        page = await store.instance_page(InstanceQuery(search="EB-12", limit=10))
        assert [row["name"] for row in page.rows] == ["web-1234"]

        def index_names(db: Any) -> set[str]:
            rows = db.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'instances'")
            return {str(name) for (name,) in rows.fetchall()}

        found = await store._read(index_names)
        assert "instances_zone_order" in found
        assert "instances_name_trgm" not in found
    finally:
        await store.close()
