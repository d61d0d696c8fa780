"""The fleet store's schema versions (bridge/fleet/migrations.py): a store written by the
last release before versioned schemas opens after the upgrade with everything it held (its
kept counts too), a newer store refuses this build with both versions named, a failed step
leaves the version before it, and replicas starting together migrate once.

The unversioned stores are fixtures that release's own code wrote (tests/fixtures/
fleet-store-v1/, made by its make.py with the code of commit 0023098); PostgreSQL is a real
server (tests/fleet/postgres_server.py: skipped without its binaries, failing under CI=true).
"""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bridge.fleet import migrations, tallies
from bridge.fleet.migrations import LATEST, SQLITE, Step
from bridge.fleet.service import build_store
from bridge.fleet.store import Batch, EventQuery, InstanceQuery, NoticeFilter, Store, StoreError
from bridge.fleet.writes import RowWriter, apply_many

pytest_plugins = ["tests.fleet.postgres_server"]

FIXTURES = Path(__file__).parents[1] / "fixtures" / "fleet-store-v1"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
#: What the upgraded store counts beside them (no instance was retired before retention).
EXPECTED["counts"]["instances_retired"] = 0
#: make.py's moment of the instance counts (web-1 reporting, the two others silent).
COUNTED_AT = datetime(2026, 11, 21, 12, 56, tzinfo=UTC).timestamp()


def load_postgres_fixture(url: str) -> None:
    """The unversioned PostgreSQL store, from its pg_dump, into the empty database at `url`."""
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute((FIXTURES / "postgres.sql").read_text().encode())


@pytest.fixture(params=["sqlite", "postgresql"])
def v1_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store as the last unversioned release left it (no schema_version table)."""
    if request.param == "sqlite":
        path = tmp_path / "fleet.sqlite3"
        shutil.copy(FIXTURES / "fleet.sqlite3", path)
        return f"sqlite://{path}"
    url: str = request.getfixturevalue("postgres_url")
    load_postgres_fixture(url)
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'fleet.sqlite3'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


async def contents(store: Store) -> dict[str, Any]:
    """What expected.json lists, read through the store's own queries."""
    page = await store.events(EventQuery(limit=1000))
    return {
        "events": [row[3].decode() for row in page.rows],
        "notices": sorted(
            [n["source"], n["notice_id"], n["status"], len(n["transitions"])]
            for n in await store.notices(NoticeFilter(), in_force=False)
        ),
        "instances": sorted(i["source"] for i in await store.instances()),
        "checkpoints": {
            "eventhubs": await store.checkpoints("eventhubs"),
            "kafka": await store.checkpoints("kafka"),
        },
        "rejected": [[r["ingest"], r["reason"]] for r in await store.rejected()],
        "counts": await store.counts(),
        "notice_counts": [list(row) for row in await store.notice_counts()],
        "instance_counts": [list(row) for row in await store.instance_counts(COUNTED_AT)],
    }


def versions(url: str) -> list[int]:
    """The steps recorded in the database, in order (one row per step applied)."""
    query = "SELECT version FROM schema_version ORDER BY version"
    if url.startswith("sqlite://"):
        with sqlite3.connect(url.removeprefix("sqlite://")) as db:
            return [v for (v,) in db.execute(query)]
    with psycopg.connect(url) as connection:
        return [v for (v,) in connection.execute(query)]


def set_version(url: str, version: int) -> None:
    """What a later release's upgrade would leave: a step this build does not know."""
    statement = (
        "INSERT INTO schema_version (version, applied_at, release, summary) "  # noqa: S608
        f"VALUES ({int(version)}, 0, '9.9.9', 'from the future')"
    )
    if url.startswith("sqlite://"):
        with sqlite3.connect(url.removeprefix("sqlite://")) as db:
            db.execute(statement)
        return
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(statement.encode())


async def test_an_unversioned_store_opens_upgraded_with_everything_kept(v1_url: str) -> None:
    store = build_store(v1_url)
    await store.open()
    try:
        assert await contents(store) == EXPECTED
    finally:
        await store.close()
    assert versions(v1_url) == [step.version for step in migrations.STEPS]
    reader = build_store(v1_url, read_only=True)  # `fleet status` after the upgrade
    await reader.open()
    try:
        assert await contents(reader) == EXPECTED
    finally:
        await reader.close()


def schema_of(url: str) -> set[tuple[str, ...]]:
    """The tables, indexes, triggers and columns of the store at `url` (on PostgreSQL
    without the month partitions, whose names depend on the date)."""
    if url.startswith("sqlite://"):
        with sqlite3.connect(url.removeprefix("sqlite://")) as db:
            found = set(
                db.execute("SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
            )
            tables = [name for kind, name in found if kind == "table"]
            for table in tables:
                found |= {
                    ("column", table, row[1]) for row in db.execute(f"PRAGMA table_info({table})")
                }
            return found
    month = "'^events_[0-9]{4}_[0-9]{2}'"
    with psycopg.connect(url) as connection:
        found = set(
            connection.execute(
                "SELECT relkind::text, relname::text FROM pg_class "  # noqa: S608
                f"WHERE relnamespace = 'public'::regnamespace AND relname !~ {month}".encode()
            )
        )
        found |= {
            ("trigger", str(name))
            for (name,) in connection.execute(
                b"SELECT tgname FROM pg_trigger WHERE NOT tgisinternal"
            )
        }
        found |= set(
            connection.execute(
                "SELECT 'column', table_name::text, column_name::text, data_type::text "  # noqa: S608
                "FROM information_schema.columns WHERE table_schema = 'public' "
                f"AND table_name !~ {month}".encode()
            )
        )
        return found


async def test_an_upgraded_store_has_the_schema_of_a_new_one(
    v1_url: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if v1_url.startswith("sqlite://"):
        fresh = f"sqlite://{tmp_path / 'fresh.sqlite3'}"
    else:
        fresh = request.getfixturevalue("postgres_server").create_database()
    for url in (v1_url, fresh):
        store = build_store(url)
        await store.open()
        await store.close()
    assert schema_of(v1_url) == schema_of(fresh)


async def test_an_upgraded_store_goes_on_taking_events(v1_url: str) -> None:
    from tests.fleet.factories import batch, gce_vm, heartbeat
    from tests.fleet.test_store import at

    store = build_store(v1_url)
    await store.open()
    try:
        result = await store.ingest(batch(heartbeat(gce_vm("web-3"), at(70), sequence=1)))
        assert result.accepted == 1
        assert (await store.counts())["events"] == EXPECTED["counts"]["events"] + 1
        page = await store.events(EventQuery(limit=1000))
        sequence = [row[0] for row in page.rows]
        assert sequence == sorted(sequence)  # old numbers kept, the new one after them
        assert sequence[-1] > sequence[-2] >= EXPECTED["counts"]["events"]
    finally:
        await store.close()


async def test_reading_a_store_not_yet_upgraded_asks_for_one_start(v1_url: str) -> None:
    with pytest.raises(StoreError, match=r"schema version 1\b.*start `maintenance-bridge fleet`"):
        await build_store(v1_url, read_only=True).open()


async def test_a_newer_store_refuses_this_build_naming_both_versions(empty_url: str) -> None:
    store = build_store(empty_url)
    await store.open()
    await store.close()
    set_version(empty_url, LATEST + 1)
    newer = (
        rf"schema version {LATEST + 1}, newer than this maintenance-bridge \S+ knows "
        rf"\(up to version {LATEST}\)"
    )
    with pytest.raises(StoreError, match=newer):
        await build_store(empty_url).open()
    with pytest.raises(StoreError, match=newer):
        await build_store(empty_url, read_only=True).open()
    assert versions(empty_url)[-1] == LATEST + 1  # untouched


async def test_replicas_starting_together_migrate_once(empty_url: str) -> None:
    stores = [build_store(empty_url) for _ in range(3)]
    await asyncio.gather(*(store.open() for store in stores))
    await asyncio.gather(*(store.close() for store in stores))
    assert versions(empty_url) == [step.version for step in migrations.STEPS]  # each once


def test_a_failed_step_leaves_the_version_before_it_and_runs_again_next_time(
    tmp_path: Path,
) -> None:
    db = sqlite3.connect(tmp_path / "fleet.sqlite3", isolation_level=None)

    def broken(db: Any, dialect: migrations.Dialect) -> None:
        db.execute("CREATE TABLE half_done (x INTEGER)")
        raise sqlite3.OperationalError("disk I/O error")

    extra: Callable[[Any, migrations.Dialect], None] = broken
    steps = [*migrations.STEPS, Step(LATEST + 1, "breaks midway", run=extra)]
    with pytest.raises(sqlite3.OperationalError):
        migrations.upgrade(db, SQLITE, "here", steps=steps)
    assert migrations.current_version(db, SQLITE) == LATEST
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'half_done'").fetchone() is None
    fixed = [*migrations.STEPS, Step(LATEST + 1, "fixed", ("CREATE TABLE half_done (x INTEGER)",))]
    assert migrations.upgrade(db, SQLITE, "here", steps=fixed) == [LATEST + 1]
    assert migrations.upgrade(db, SQLITE, "here", steps=fixed) == []


#: The silent instances' trigger as the releases before step 10 made it: it moved an
#: instance at every heartbeat (the heartbeat writer did not).
SILENT_CHANGED_BEFORE_10 = (
    "OLD.last_heartbeat IS DISTINCT FROM NEW.last_heartbeat "
    "OR OLD.heartbeat_interval IS DISTINCT FROM NEW.heartbeat_interval "
    f"OR {tallies._INSTANCE_CHANGED}"
)


#: The heartbeat's own update, as the releases before the heartbeat was folded into the
#: instance upsert wrote it (a later heartbeat only).
UPDATE_HEARTBEAT_UNFOLDED = (
    "UPDATE instances SET last_heartbeat = ?, heartbeat_interval = ?, agent_version = ?, "
    "watcher_healthy = ?, spool_depth = ?, started_at = ? "
    "WHERE source = ? AND (last_heartbeat IS NULL OR last_heartbeat <= ?)"
)


class WriterBefore10:
    """The store's writer as it was before step 10: heartbeats by the plain update, the
    trigger moving their instances in the silent tallies."""

    def __init__(self, url: str) -> None:
        if url.startswith("sqlite://"):
            self.rows: Any = RowWriter()
        else:
            from bridge.fleet.postgres_store import WRITER

            self.rows = WRITER

    def insert_events(self, db: Any, rows: list[Any]) -> set[tuple[str, str]]:
        return set(self.rows.insert_events(db, rows))

    def upsert_instances(self, db: Any, rows: list[Any]) -> None:
        self.rows.upsert_instances(db, [(*row[:14], *[None] * 6) for row in rows])
        beats = [(*row[14:], row[0], row[14]) for row in rows if row[14] is not None]
        db.executemany(UPDATE_HEARTBEAT_UNFOLDED, beats)

    def upsert_notices(self, db: Any, rows: list[Any]) -> None:
        self.rows.upsert_notices(db, rows)


async def test_a_store_of_schema_9_opens_at_10_with_its_rows_and_counts(
    empty_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 10 (#33): the notice history index without heartbeats, the retired instances'
    index, and the silent tallies moved by the heartbeat writer rather than a trigger. A
    store written at version 9 (its trigger, its writer) keeps every row and figure, and
    its counts go on equal to a recount as heartbeats arrive."""
    from bridge.pipeline.model import Status
    from tests.fleet.factories import batch, gce_vm, heartbeat, transition
    from tests.fleet.test_store import at

    upgrade = migrations.upgrade
    monkeypatch.setattr(
        migrations, "upgrade", functools.partial(upgrade, steps=migrations.STEPS[:9])
    )
    monkeypatch.setattr(tallies, "_SILENT_CHANGED", SILENT_CHANGED_BEFORE_10)
    postgres = not empty_url.startswith("sqlite://")
    vms = [gce_vm(f"vm-{i}", zone=f"zone-{i % 3}") for i in range(6)]
    store = build_store(empty_url)
    await store.open()
    try:
        await store.transaction(lambda db: tallies.narrow_silent_trigger(db, postgres=postgres))
        before = WriterBefore10(empty_url)

        def write_before_10(db: Any, batches: list[Batch]) -> None:
            apply_many(db, batches, before)

        for written in (
            batch(*(heartbeat(vm, at(-i * 3), interval=60.0 + 30 * i) for i, vm in enumerate(vms))),
            batch(
                transition(vms[0], "n-1", Status.SCHEDULED, at(0)),
                transition(vms[0], "n-1", Status.STARTED, at(1)),
                heartbeat(vms[1], at(2), interval=60.0),
            ),
        ):
            await store.transaction(functools.partial(write_before_10, batches=[written]))
        await store.transaction(
            lambda db: db.execute("UPDATE instances SET retired_at = 1 WHERE name = 'vm-5'")
        )
        counts = await store.counts()
        silent = await store.instance_counts(at(4).timestamp())
    finally:
        await store.close()
    assert versions(empty_url)[-1] == 9
    monkeypatch.undo()

    store = build_store(empty_url)
    await store.open()
    try:
        assert versions(empty_url) == list(range(1, LATEST + 1))
        assert await store.counts() == counts
        assert await store.instance_counts(at(4).timestamp()) == silent
        assert await silent_by_recount(store, at(4).timestamp())
        (notice,) = await store.notices(NoticeFilter(), in_force=True)
        assert [t["status"] for t in notice["transitions"]] == ["scheduled", "started"]
        retired = await store.instance_page(InstanceQuery(state="retired", limit=10))
        assert [row["name"] for row in retired.rows] == ["vm-5"]
        # Heartbeats after the upgrade, by this build's writer: the counts follow them.
        await store.ingest(
            batch(*(heartbeat(vm, at(5), interval=90.0, sequence=1) for vm in vms[2:5]))
        )
        await store.ingest(batch(heartbeat(vms[0], at(6), interval=30.0, sequence=1)))
        for minutes in (0, 4, 7, 9, 12, 30):
            assert await silent_by_recount(store, at(minutes).timestamp()), minutes
        assert (await store.counts())["events"] == counts["events"] + 4
    finally:
        await store.close()


async def silent_by_recount(store: Store, now: float) -> bool:
    """Whether the silent instances the tallies count at `now` are those a recount finds."""

    def recount(db: Any) -> dict[tuple[str, str, str], int]:
        rows = db.execute(
            "SELECT provider, COALESCE(agent_version, 'unknown'), COALESCE(zone, ''), "
            "COUNT(*) FROM instances WHERE last_heartbeat IS NULL "
            "OR last_heartbeat + 3 * heartbeat_interval < ? GROUP BY 1, 2, 3",
            (now,),
        ).fetchall()
        return {(str(p), str(v), str(z)): int(n) for p, v, z, n in rows}

    kept = {(p, v, z): s for p, v, z, _total, s in await store.instance_counts(now) if s}
    found: dict[tuple[str, str, str], int] = await store._read(recount)  # type: ignore[attr-defined]
    return kept == found
