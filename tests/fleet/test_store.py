"""Both fleet stores keep the rules of bridge/fleet/store.py: idempotent, forward-only,
append-only audit log, rejected inputs kept, checkpoints committed with their events.

Every test runs against SQLite and against a real PostgreSQL server
(tests/fleet/postgres_server.py; skipped without its binaries, failing under CI=true)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from bridge import contract
from bridge.fleet.service import build_store
from bridge.fleet.store import Batch, EventQuery, NoticeFilter, Refused, Store
from bridge.pipeline.model import Kind, Status
from tests.fleet.factories import (
    T0,
    approval,
    azure_vm,
    batch,
    gce_vm,
    heartbeat,
    hook_run,
    transition,
)
from tests.support import eventually

GCE = gce_vm("web-1")
AZ = azure_vm("db-1", scale_set="db-set")
ALL = NoticeFilter()


pytest_plugins = ["tests.fleet.postgres_server"]


@pytest.fixture(params=["sqlite", "postgresql"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Store]:
    """A new store object on the test's database (the same one each call: reopening)."""
    if request.param == "sqlite":
        url = f"sqlite://{tmp_path / 'fleet.sqlite3'}"
    else:
        url = request.getfixturevalue("postgres_url")
    return lambda: build_store(url)


@pytest.fixture
def make_two(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], tuple[Store, Store]]:
    """Two stores on two databases of the kind `make_store` is (the test asks for both)."""
    if request.node.callspec.params["make_store"] == "sqlite":
        urls = [f"sqlite://{tmp_path / f'fleet-{n}.sqlite3'}" for n in range(2)]
    else:
        server = request.getfixturevalue("postgres_server")
        urls = [server.create_database() for _ in range(2)]
    return lambda: (build_store(urls[0]), build_store(urls[1]))


@pytest.fixture
async def store(make_store: Callable[[], Store]) -> AsyncIterator[Store]:
    store = make_store()
    await store.open()
    yield store
    await store.close()


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


async def test_a_replayed_event_is_a_duplicate_and_changes_nothing(store: Store) -> None:
    scheduled = transition(AZ, "ev-1", Status.SCHEDULED, at(0), not_before=at(15))
    first = await store.ingest(batch(scheduled, heartbeat(AZ, at(0))))
    again = await store.ingest(batch(scheduled, scheduled, ingest="pubsub"))
    assert (first.accepted, first.duplicate) == (2, 0)
    assert (again.accepted, again.duplicate) == (0, 2)
    counts = await store.counts()
    assert (counts["events"], counts["notices"], counts["instances"]) == (2, 1, 1)
    (notice,) = await store.notices(ALL)
    assert [t["status"] for t in notice["transitions"]] == ["scheduled"]


async def test_an_old_transition_arriving_late_never_reverts_a_newer_one(
    store: Store,
) -> None:
    scheduled = transition(AZ, "ev-1", Status.SCHEDULED, at(0), not_before=at(15))
    started = transition(AZ, "ev-1", Status.STARTED, at(15))
    completed = transition(AZ, "ev-1", Status.COMPLETED, at(20))
    await store.ingest(batch(completed))
    await store.ingest(batch(started, scheduled))
    assert await store.notices(ALL) == []  # completed: not in force
    (notice,) = await store.notices(ALL, in_force=False)
    assert notice["status"] == "completed"
    assert [t["status"] for t in notice["transitions"]] == ["scheduled", "started", "completed"]


async def test_a_later_revision_of_the_same_status_wins(store: Store) -> None:
    # Azure moved the maintenance while it was Scheduled: a second announcement of the same
    # status, a revision with an event id of its own (not a duplicate of the first).
    first = transition(AZ, "ev-1", Status.SCHEDULED, at(0), not_before=at(15))
    moved = transition(AZ, "ev-1", Status.SCHEDULED, at(5), not_before=at(30), revision="r2")
    assert contract.from_cloudevent(first).id != contract.from_cloudevent(moved).id
    in_order = await store.ingest(batch(first))
    later = await store.ingest(batch(moved))
    assert (in_order.accepted, later.accepted, later.duplicate) == (1, 1, 0)
    (notice,) = await store.notices(ALL)
    assert notice["not_before"] == "2026-11-21T12:30:00Z"  # the later revision's

    # And arriving out of order: the older revision, received last, changes nothing.
    late = transition(AZ, "ev-2", Status.SCHEDULED, at(0), not_before=at(15))
    newer = transition(AZ, "ev-2", Status.SCHEDULED, at(5), not_before=at(30), revision="r2")
    await store.ingest(batch(newer))
    older = await store.ingest(batch(late))
    assert (older.accepted, older.duplicate) == (1, 0)  # kept in the audit log
    (notice,) = await store.notices(NoticeFilter(instance="db-1", search="ev-2"))
    assert notice["not_before"] == "2026-11-21T12:30:00Z"
    assert (await store.counts())["events"] == 4


async def test_filters_select_notices_in_force(store: Store) -> None:
    other = gce_vm("web-2", zone="europe-west1-b")
    await store.ingest(
        batch(
            transition(GCE, "g-1", Status.STARTED, at(0), kind=Kind.LIVE_MIGRATE),
            transition(other, "g-2", Status.SCHEDULED, at(0), kind=Kind.TERMINATE),
            transition(AZ, "ev-1", Status.SCHEDULED, at(1), not_before=at(15)),
        )
    )

    async def names(**where: str) -> list[str]:
        return sorted(n["notice_id"] for n in await store.notices(NoticeFilter(**where)))

    assert await names() == ["ev-1", "g-1", "g-2"]
    assert await names(provider="gce") == ["g-1", "g-2"]
    assert await names(zone="europe-west1-b") == ["g-2"]
    assert await names(kind="reboot") == ["ev-1"]
    assert await names(status="started") == ["g-1"]
    assert await names(instance="db-1") == ["ev-1"]
    assert await names(instance=GCE.source) == ["g-1"]


async def test_an_azure_zone_is_filed_under_its_region(store: Store) -> None:
    # Azure says "1" for zone 1 of any region: two regions' zone 1 must not be one zone, and
    # a VM without a zone is filed under its region. GCE's zones name their region already.
    west, east = azure_vm("w-1", zone="1"), azure_vm("e-1", zone="1", location="eastus")
    regional = azure_vm("r-1", zone=None, location="eastus")
    await store.ingest(
        batch(
            *(transition(vm, f"ev-{vm.name}", Status.SCHEDULED, at(0)) for vm in (west, east)),
            transition(regional, "ev-r-1", Status.SCHEDULED, at(0)),
            transition(GCE, "g-1", Status.SCHEDULED, at(0)),
        )
    )
    zones = {n["instance"]: n["zone"] for n in await store.notices(ALL)}
    assert zones == {
        "w-1": "westeurope-1",
        "e-1": "eastus-1",
        "r-1": "eastus",
        "web-1": GCE.zone,
    }
    assert [n["instance"] for n in await store.notices(NoticeFilter(zone="eastus-1"))] == ["e-1"]


async def test_approvals_and_hook_outcomes_join_their_notice(store: Store) -> None:
    scheduled = transition(AZ, "ev-1", Status.SCHEDULED, at(0), not_before=at(15))
    await store.ingest(batch(scheduled, hook_run(scheduled, at(1)), approval(scheduled, at(2))))
    (notice,) = await store.notices(ALL)
    (hook,) = notice["hooks"]
    (approved,) = notice["approvals"]
    assert (hook["hook"], hook["outcome"]) == ("drain", "succeeded")
    assert approved["rule"] == "preset"
    scheduled_id = notice["transitions"][0]["event_id"]
    assert hook["trigger_event_id"] == approved["trigger_event_id"] == scheduled_id
    assert hook["event_id"] != scheduled_id


async def test_heartbeats_fill_the_instance_and_a_late_one_does_not_go_back(
    store: Store,
) -> None:
    await store.ingest(batch(heartbeat(AZ, at(10), sequence=2)))
    await store.ingest(batch(heartbeat(AZ, at(5), sequence=1)))
    (instance,) = await store.instances()
    assert instance["last_heartbeat"] == at(10).timestamp()
    assert instance["first_seen"] == at(5).timestamp()
    assert (instance["name"], instance["scale_set"], instance["provider"]) == (
        "db-1",
        "db-set",
        "azure",
    )
    assert (instance["heartbeat_interval"], instance["watcher_healthy"]) == (60.0, True)


async def test_refused_input_is_kept_with_its_reason_and_checkpoints_commit(
    store: Store,
) -> None:
    result = await store.ingest(
        Batch(
            ingest="eventhubs",
            received_at=at(0).timestamp(),
            refused=[Refused(b"{nope", "not JSON")],
            checkpoints={"0": "1200", "1": "88"},
        )
    )
    assert result.invalid == 1
    (rejected,) = await store.rejected()
    assert (rejected["ingest"], rejected["reason"], rejected["body"]) == (
        "eventhubs",
        "not JSON",
        "{nope",
    )
    assert await store.checkpoints("eventhubs") == {"0": "1200", "1": "88"}
    assert await store.checkpoints("pubsub") == {}


async def test_the_audit_log_pages_in_receive_order_and_filters(store: Store) -> None:
    bodies = [heartbeat(GCE, at(i), sequence=i) for i in range(5)]
    bodies.append(transition(AZ, "ev-1", Status.SCHEDULED, at(2), not_before=at(15)))
    await store.ingest(batch(*bodies))
    page = await store.events(EventQuery(limit=4))
    assert [row[3] for row in page.rows] == bodies[:4]
    assert page.next_cursor is not None
    rest = await store.events(EventQuery(limit=4, cursor=page.next_cursor))
    assert [row[3] for row in rest.rows] == bodies[4:]
    assert rest.next_cursor is None
    only_az = await store.events(EventQuery(instance="db-1"))
    assert [row[3] for row in only_az.rows] == bodies[5:]
    window = await store.events(EventQuery(since=at(1).timestamp(), until=at(3).timestamp()))
    assert len(window.rows) == 3  # two heartbeats and the transition at minute 2
    assert {row[1] for row in window.rows} == {"http"}


async def test_the_state_survives_a_reopen(make_store: Callable[[], Store]) -> None:
    store = make_store()
    await store.open()
    await store.ingest(batch(transition(GCE, "g-1", Status.STARTED, at(0))))
    await store.close()
    again = make_store()
    await again.open()
    try:
        assert [n["notice_id"] for n in await again.notices(ALL)] == ["g-1"]
        await again.ping()
    finally:
        await again.close()


async def test_a_group_of_batches_leaves_what_the_batches_one_by_one_leave(
    make_store: Callable[[], Store], make_two: Callable[[], tuple[Store, Store]]
) -> None:
    """Group commit writes the batches of a transaction together, each table once
    (`bridge.fleet.writes.apply_many`): each batch's counts and the state are what the same
    batches give one after the other - an event in two batches (new once, at its first),
    a notice's transitions out of order, heartbeats out of order, a VM moved to another zone,
    refused input and checkpoints."""
    other = azure_vm("db-2")
    moved = azure_vm("db-1", scale_set="db-set", zone="2")
    scheduled = transition(AZ, "ev-1", Status.SCHEDULED, at(0), not_before=at(15))
    started = transition(AZ, "ev-1", Status.STARTED, at(15))
    completed = transition(AZ, "ev-1", Status.COMPLETED, at(20))
    cancelled = transition(AZ, "ev-1", Status.CANCELLED, at(25))
    revised = transition(AZ, "ev-2", Status.SCHEDULED, at(8), not_before=at(40))
    later = transition(AZ, "ev-2", Status.SCHEDULED, at(1), not_before=at(30))  # its id
    groups = [
        batch(started, heartbeat(AZ, at(5), sequence=2), revised),
        batch(scheduled, heartbeat(AZ, at(3), sequence=1), later, ingest="pubsub"),
        batch(started, completed, heartbeat(other, at(4)), heartbeat(moved, at(30), sequence=4)),
        batch(cancelled, heartbeat(AZ, at(5), sequence=3)),
        Batch(
            ingest="pubsub",
            received_at=at(70).timestamp(),
            refused=[Refused(b"{}", "not an event")],
            checkpoints={"0": "17"},
        ),
    ]
    one_by_one, grouped = make_two()
    for store in (one_by_one, grouped):
        await store.open()
    try:
        each = [await one_by_one.ingest(b) for b in groups]
        together = await grouped.ingest_many(groups)
        assert [(r.accepted, r.duplicate, r.invalid) for r in together] == [
            (r.accepted, r.duplicate, r.invalid) for r in each
        ]
        assert [r.accepted for r in together] == [3, 2, 3, 2, 0]
        for store in (one_by_one, grouped):
            assert await store.checkpoints("pubsub") == {"0": "17"}
        assert await grouped.counts() == await one_by_one.counts()
        assert await grouped.notices(ALL, in_force=False) == await one_by_one.notices(
            ALL, in_force=False
        )
        assert await grouped.instances() == await one_by_one.instances()
        (row,) = [i for i in await grouped.instances() if i["name"] == "db-1"]
        assert (row["zone"], row["last_heartbeat"]) == ("westeurope-1", at(30).timestamp())
    finally:
        for store in (one_by_one, grouped):
            await store.close()


async def test_sqlite_opens_while_another_opener_holds_the_new_file(tmp_path: Path) -> None:
    """The switch to WAL needs the file's exclusive lock, for which SQLite does not wait:
    a replica opening while another holds the lock retries (`bridge.infra.backoff.retry_for`)
    instead of failing with "database is locked"."""
    import asyncio
    import sqlite3

    path = tmp_path / "fleet.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    store = build_store(f"sqlite://{path}")
    opening = asyncio.create_task(store.open())
    await asyncio.sleep(0.3)  # the open is retrying now: the lock is held
    assert not opening.done()
    holder.execute("COMMIT")
    holder.close()
    await asyncio.wait_for(opening, 10)
    try:
        assert (await store.counts())["events"] == 0
    finally:
        await store.close()
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def _wal_frames(path: Path) -> tuple[int, int]:
    """(frames in the write-ahead log, frames of it copied into the database), from the
    WAL index (https://www.sqlite.org/walformat.html: the header's `mxFrame` at byte 16,
    the checkpoint information's `nBackfill` at byte 96, native byte order), read without
    checkpointing anything."""
    import struct

    head = Path(f"{path}-shm").read_bytes()[:100]
    return struct.unpack_from("=I", head, 16)[0], struct.unpack_from("=I", head, 96)[0]


async def test_sqlite_checkpoints_beside_the_writer(tmp_path: Path) -> None:
    """The log is copied into the database by the store's checkpointer thread, off the
    writer's turn: the writer's own automatic checkpoint waits for
    `WRITER_CHECKPOINT_PAGES`, which these few writes are far from."""
    from bridge.fleet import sqlite_store

    path = tmp_path / "fleet.sqlite3"
    store = build_store(f"sqlite://{path}")
    await store.open()
    try:
        for minute in range(5):
            vms = [gce_vm(f"vm-{minute}-{n}") for n in range(50)]
            await store.ingest(batch(*(heartbeat(vm, at(minute)) for vm in vms)))
        frames, _copied = _wal_frames(path)
        assert 0 < frames < sqlite_store.WRITER_CHECKPOINT_PAGES
        await eventually(lambda: _wal_frames(path)[1] == _wal_frames(path)[0])
        assert (await store.counts())["events"] == 250
    finally:
        await store.close()
