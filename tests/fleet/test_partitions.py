"""PostgreSQL's audit log partitioned by month (bridge/fleet/partitions.py): idempotence on
(source, id) across partitions through `event_keys`, a month past retention dropped whole
with its keys pruned, stray rows of DEFAULT moved into their month when it is made.

A real PostgreSQL server (tests/fleet/postgres_server.py: skipped without its binaries,
failing under CI=true).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from bridge.fleet import partitions
from bridge.fleet.postgres_store import PostgresStore
from bridge.fleet.retention import FleetRetention, Pruner
from bridge.fleet.store import EventQuery
from bridge.pipeline.model import Status
from tests.fleet.factories import batch, gce_vm, heartbeat, transition

pytest_plugins = ["tests.fleet.postgres_server"]

VM = gce_vm("web-1")
MARCH = datetime(2025, 3, 10, tzinfo=UTC)


@pytest.fixture
def store(postgres_store: PostgresStore) -> PostgresStore:
    return postgres_store


def rows(url: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as connection:
        return connection.execute(query.encode()).fetchall()


def where_events_are(url: str) -> dict[str, int]:
    """Rows of the audit log by partition."""
    found = rows(url, "SELECT tableoid::regclass::text, COUNT(*) FROM events GROUP BY 1")
    return {str(name): int(count) for name, count in found}


async def test_the_audit_log_is_partitioned_by_month_ahead_of_time(store: PostgresStore) -> None:
    (strategy,) = rows(store.url, "SELECT partstrat FROM pg_partitioned_table")[0]
    assert strategy == "r"  # range, on received_at
    now = datetime.now(UTC)
    this_month = partitions.partition_name(now.year, now.month)
    following = partitions.partition_name(*partitions.next_month(now.year, now.month))
    names = {name for (name,) in rows(store.url, "SELECT relname FROM pg_class")}
    assert {this_month, following, "events_default", "event_keys"} <= names


async def test_the_same_event_received_in_two_months_is_stored_once(
    store: PostgresStore,
) -> None:
    event = transition(VM, "n-1", Status.SCHEDULED, MARCH, not_before=MARCH + timedelta(days=1))
    first = await store.ingest(batch(event, received=MARCH))
    again = await store.ingest(batch(event, event, received=MARCH + timedelta(days=40)))
    assert (first.accepted, again.accepted, again.duplicate) == (1, 0, 2)
    assert (await store.counts())["events"] == 1


async def test_a_month_past_retention_goes_whole_and_its_keys_after_it(
    store: PostgresStore,
) -> None:
    await store.transaction(lambda db: partitions.ensure_months(db, [MARCH.timestamp()]))
    scheduled = transition(VM, "n-1", Status.SCHEDULED, MARCH, not_before=MARCH)
    await store.ingest(batch(scheduled, heartbeat(VM, MARCH), received=MARCH))
    later = MARCH + timedelta(days=45)
    await store.ingest(batch(transition(VM, "n-1", Status.COMPLETED, later), received=later))
    assert where_events_are(store.url) == {"events_2025_03": 2, "events_2025_04": 1}

    now = datetime(2026, 4, 20, tzinfo=UTC)  # 400 days back: 2025-03-16, inside March
    pass_at = Pruner(store, FleetRetention(retire_after_days=1000), clock=now.timestamp)
    report = await pass_at.run_pass()
    # March still holds rows younger than 400 days: kept, only its heartbeat goes.
    assert (report.heartbeats, report.events) == (1, 0)
    assert where_events_are(store.url) == {"events_2025_03": 1, "events_2025_04": 1}

    report = await Pruner(
        store, FleetRetention(retire_after_days=1000), clock=(now + timedelta(days=20)).timestamp
    ).run_pass()
    assert report.partitions >= 1  # March dropped whole...
    assert report.events == 0  # ... no row deleted
    assert where_events_are(store.url) == {"events_2025_04": 1}
    keys = rows(store.url, "SELECT received_at FROM event_keys ORDER BY received_at")
    assert [k for (k,) in keys] == [later.timestamp()]  # March's keys pruned with it
    page = await store.events(EventQuery())
    assert len(page.rows) == 1


async def test_stray_rows_of_default_move_into_their_month_when_it_is_made(
    store: PostgresStore,
) -> None:
    far = datetime(2031, 6, 5, tzinfo=UTC)
    await store.ingest(batch(heartbeat(VM, far), received=far))
    assert where_events_are(store.url) == {"events_default": 1}
    created = await store.transaction(lambda db: partitions.ensure_months(db, [far.timestamp()]))
    assert created == 2  # June and July 2031
    assert where_events_are(store.url) == {"events_2031_06": 1}
    assert len((await store.events(EventQuery())).rows) == 1


async def test_a_month_held_by_a_long_read_is_dropped_by_a_later_pass_not_waited_for(
    store: PostgresStore,
) -> None:
    await store.transaction(lambda db: partitions.ensure_months(db, [MARCH.timestamp()]))
    await store.ingest(batch(transition(VM, "n-1", Status.STARTED, MARCH), received=MARCH))
    now = datetime(2026, 6, 1, tzinfo=UTC)  # March 2025 is past 400 days
    with psycopg.connect(store.url) as export:  # a long read: its transaction stays open
        export.execute(b"SELECT COUNT(*) FROM events").fetchone()
        report = await Pruner(store, FleetRetention(), clock=now.timestamp).run_pass()
        assert report.partitions == 0  # gave up after lock_timeout; ingest never queued
        assert "events_2025_03" in where_events_are_now(export)
    report = await Pruner(store, FleetRetention(), clock=now.timestamp).run_pass()
    assert report.partitions >= 1
    assert where_events_are(store.url) == {}


def where_events_are_now(connection: psycopg.Connection[Any]) -> set[str]:
    rows = connection.execute(b"SELECT relname FROM pg_class WHERE relname LIKE 'events_2%'")
    return {str(name) for (name,) in rows.fetchall()}
