"""Reads that stay fast at 100,000 instances: keyset pages that are complete and stable while
events arrive, counts kept as events arrive (equal to a recount), and indexes the read
queries use. Every test runs on SQLite and on a real PostgreSQL server
(tests/fleet/postgres_server.py; skipped without its binaries, failing under CI=true)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridge.fleet import paging, tallies
from bridge.fleet.api import fleet_summary
from bridge.fleet.config import parse_fleet_config
from bridge.fleet.reads import Reads
from bridge.fleet.service import FleetService, build_store
from bridge.fleet.store import EventQuery, InstanceQuery, NoticeFilter, Store
from bridge.pipeline.model import Status
from tests.fleet.capture import Capture
from tests.fleet.factories import T0, azure_vm, batch, gce_vm, heartbeat, transition

pytest_plugins = ["tests.fleet.postgres_server"]

NOW = (T0 + timedelta(hours=1)).timestamp()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'fleet.sqlite3'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    store = build_store(store_url)
    await store.open()
    yield store
    await store.close()


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


async def every_instance(store: Store, limit: int, between: Callable[[int], Any]) -> list[str]:
    """Names of every page of instances, `between(n)` awaited after the n-th page."""
    names: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = await store.instance_page(InstanceQuery(cursor=cursor, limit=limit, now=NOW))
        assert len(page.rows) <= limit
        names += [row["name"] for row in page.rows]
        pages += 1
        if page.next is None:
            return names
        await between(pages)
        cursor = page.next


async def test_instance_pages_are_complete_and_stable_while_instances_arrive(
    store: Store,
) -> None:
    first = [f"vm-{i:03d}" for i in range(0, 50, 2)]
    await store.ingest(batch(*(heartbeat(gce_vm(name), at(0)) for name in first)))

    async def arrive(page: int) -> None:
        # One sorts before the pages read so far, one after: neither shifts the pages.
        early, late = f"vm-{page:03d}a", f"vm-{100 + page:03d}"
        await store.ingest(batch(heartbeat(gce_vm(early), at(1)), heartbeat(gce_vm(late), at(1))))

    names = await every_instance(store, 7, arrive)
    assert names == sorted(names)  # in order
    assert len(names) == len(set(names))  # nothing twice
    assert set(first) <= set(names)  # nothing that was there is missed
    assert {n for n in names if n.startswith("vm-1")} >= {"vm-101", "vm-102", "vm-103"}


async def test_notice_pages_are_soonest_first_complete_and_stable(store: Store) -> None:
    vms = [gce_vm(f"vm-{i}") for i in range(12)]
    await store.ingest(
        batch(
            *(
                transition(vm, f"n-{i}", Status.SCHEDULED, at(0), not_before=at(60 - i))
                for i, vm in enumerate(vms)
            ),
            transition(vms[0], "n-unknown", Status.SCHEDULED, at(0)),
        )
    )
    seen: list[str] = []
    cursor = None
    while True:
        page = await store.notice_page(NoticeFilter(), cursor=cursor, limit=5)
        seen += [n["notice_id"] for n in page.rows]
        if page.next is None:
            break
        # Meanwhile: one notice finishes (it leaves later pages), one arrives at the end.
        done = 11 - len(seen) // 5
        await store.ingest(
            batch(
                transition(vms[done], f"n-{done}", Status.COMPLETED, at(2)),
                transition(
                    vms[1], f"late-{len(seen)}", Status.SCHEDULED, at(2), not_before=at(600)
                ),
            )
        )
        cursor = page.next
    assert len(seen) == len(set(seen))
    assert seen[:5] == ["n-11", "n-10", "n-9", "n-8", "n-7"]  # soonest first
    assert seen[-1] == "n-unknown"  # an unknown start sorts last
    assert {"late-5", "late-10"} <= set(seen)  # arrived after the position: on a later page


async def test_rejected_pages_go_back_in_time(store: Store) -> None:
    from bridge.fleet.store import Batch, Refused

    for index in range(7):
        await store.ingest(Batch("http", NOW, refused=[Refused(b"{}", f"reason {index}")]))
    first = await store.rejected_page(cursor=None, limit=3)
    second = await store.rejected_page(cursor=first.next, limit=3)
    third = await store.rejected_page(cursor=second.next, limit=3)
    reasons = [r["reason"] for page in (first, second, third) for r in page.rows]
    assert reasons == [f"reason {i}" for i in range(6, -1, -1)]
    assert third.next is None


async def test_instances_are_searched_and_filtered_in_the_store(store: Store) -> None:
    await store.ingest(
        batch(
            heartbeat(gce_vm("web-1"), at(0)),
            heartbeat(gce_vm("web-2", zone="europe-west1-b"), at(0)),
            heartbeat(azure_vm("DB_1"), at(0)),
            heartbeat(gce_vm("old-1"), at(-600)),  # silent by NOW
            transition(gce_vm("web-1"), "g-1", Status.SCHEDULED, at(0), not_before=at(90)),
        )
    )

    async def names(**query: Any) -> list[str]:
        page = await store.instance_page(InstanceQuery(now=at(1).timestamp(), **query))
        return [row["name"] for row in page.rows]

    assert await names(search="WEB") == ["web-1", "web-2"]
    assert await names(search="b_") == ["DB_1"]  # `_` is a character, not a wildcard
    assert await names(search="%") == []
    assert await names(zone="europe-west1-b") == ["web-2"]
    assert await names(provider="azure") == ["DB_1"]
    assert await names(state="silent") == ["old-1"]
    assert await names(state="reporting") == ["DB_1", "web-1", "web-2"]
    (web,) = (await store.instance_page(InstanceQuery(search="web-1", now=NOW))).rows
    assert web["notices"] == ["g-1"]


async def test_counts_kept_as_events_arrive_equal_a_recount(store: Store) -> None:
    a, b = gce_vm("web-1"), azure_vm("db-1")
    await store.ingest(
        batch(
            heartbeat(a, at(0)),
            heartbeat(b, at(-600)),
            transition(a, "g-1", Status.SCHEDULED, at(0), not_before=at(30)),
            transition(b, "ev-1", Status.SCHEDULED, at(0), not_before=at(30)),
        )
    )
    await store.ingest(batch(transition(a, "g-1", Status.STARTED, at(30))))
    await store.ingest(batch(transition(b, "ev-1", Status.COMPLETED, at(40))))
    await store.ingest(batch(transition(b, "ev-1", Status.SCHEDULED, at(1))))  # late: no change
    counts = await store.counts()
    assert counts == {
        "events": 6,
        "instances": 2,
        "notices": 2,
        "notices_in_force": 1,
        "rejected": 0,
        "instances_retired": 0,
    }
    assert await store.notice_counts() == [("gce", "us-central1-a", "reboot", "started", 1)]
    rows = await store.instance_counts(at(1).timestamp())
    assert sorted((p, z, n, silent) for p, _v, z, n, silent in rows) == [
        ("azure", "westeurope-1", 1, 1),
        ("gce", "us-central1-a", 1, 0),
    ]


async def test_silent_counts_from_the_minute_tallies_equal_a_recount_at_any_time(
    store: Store,
) -> None:
    vms = [gce_vm(f"vm-{i}", zone=f"zone-{i % 3}") for i in range(9)]
    # Heartbeats at various times and intervals, then later ones moving some VMs on.
    await store.ingest(
        batch(*(heartbeat(vm, at(-i * 2), interval=30.0 + 15 * i) for i, vm in enumerate(vms)))
    )
    await store.ingest(batch(*(heartbeat(vm, at(1), interval=60.0) for vm in vms[:4])))
    await store.ingest(batch(transition(gce_vm("no-heartbeat"), "n-1", Status.SCHEDULED, at(0))))

    def recount(db: Any, now: float) -> list[tuple[str, int]]:
        rows = db.execute(
            "SELECT zone, COUNT(*) FROM instances WHERE last_heartbeat IS NULL "
            "OR last_heartbeat + 3 * heartbeat_interval < ? GROUP BY zone ORDER BY zone",
            (now,),
        ).fetchall()
        return [(str(z), int(n)) for z, n in rows]

    for minutes in (-20, -3, 0, 0.5, 2, 3.9, 4.01, 7, 30, 600):
        now = at(minutes).timestamp()
        kept = await store.instance_counts(now)
        by_zone: dict[str, int] = {}
        for _p, _v, zone, _total, silent in kept:
            if silent:
                by_zone[zone] = by_zone.get(zone, 0) + silent
        expected = await store._read(lambda db, now=now: recount(db, now))  # type: ignore[attr-defined]
        assert sorted(by_zone.items()) == expected, minutes


async def test_silent_counts_follow_a_vm_moved_in_the_write_of_its_heartbeat(
    store: Store,
) -> None:
    """The heartbeat is written by the instance upsert (one row write): a VM that moves to
    another zone in the same write as a newer heartbeat, a late one, or one of the same
    moment, alone or grouped with others, leaves the silent counts equal to a recount."""
    vms = [azure_vm(f"vm-{i}", zone="1") for i in range(6)]
    await store.ingest(batch(*(heartbeat(vm, at(0), interval=60.0) for vm in vms)))
    moved = [azure_vm(f"vm-{i}", zone="2") for i in range(6)]
    await store.ingest(batch(heartbeat(moved[0], at(5), interval=120.0, sequence=1)))
    await store.ingest(batch(heartbeat(moved[1], at(-5), interval=300.0, sequence=1)))  # late
    await store.ingest(batch(heartbeat(moved[2], at(0), interval=60.0, sequence=1)))  # same
    await store.ingest_many(
        [
            batch(heartbeat(moved[3], at(6), interval=30.0, sequence=1)),
            batch(heartbeat(vms[3], at(7), interval=45.0, sequence=2)),  # and back
            batch(heartbeat(moved[4], at(-1), interval=600.0, sequence=1)),  # late
            batch(heartbeat(moved[5], at(2), interval=60.0, sequence=1)),
        ]
    )

    def recount(db: Any, now: float) -> list[tuple[str, int]]:
        rows = db.execute(
            "SELECT zone, COUNT(*) FROM instances WHERE last_heartbeat IS NULL "
            "OR last_heartbeat + 3 * heartbeat_interval < ? GROUP BY zone ORDER BY zone",
            (now,),
        ).fetchall()
        return [(str(z), int(n)) for z, n in rows]

    for minutes in (0, 2, 3.5, 4, 5, 8, 9, 11, 30):
        now = at(minutes).timestamp()
        by_zone: dict[str, int] = {}
        for _p, _v, zone, _total, silent in await store.instance_counts(now):
            if silent:
                by_zone[zone] = by_zone.get(zone, 0) + silent
        expected = await store._read(lambda db, now=now: recount(db, now))  # type: ignore[attr-defined]
        assert sorted(by_zone.items()) == expected, minutes


async def test_a_store_written_before_the_counts_is_counted_once_on_open(
    store_url: str, store: Store
) -> None:
    await store.ingest(batch(heartbeat(gce_vm("web-1"), at(0)), heartbeat(gce_vm("web-2"), at(0))))
    before = await store.counts()

    def before_the_counts(db: Any) -> None:  # what a store of the release before them holds
        db.execute("DELETE FROM tallies")
        db.execute("DELETE FROM schema_version WHERE version >= 6")  # the tallies' step

    await store.transaction(before_the_counts)
    await store.close()
    again = build_store(store_url)
    await again.open()
    try:
        assert await again.counts() == before
        summary = await fleet_summary(again)
        assert summary["instances"]["total"] == 2
    finally:
        await again.close()


ZONES = ("us-central1-a", "us-central1-b", "europe-west1-b", "asia-east1-a")
#: The main reads of the API and the page: (its first statement's) index, as each planner
#: picks it at a fleet's proportions (a zone holds a quarter, a notice in force per 20 VMs).
MAIN_READS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "notices in force": (
        lambda db: Reads.notice_page(db, NoticeFilter(), None, 100, None),
        "notices_order",
    ),
    "a zone's notices": (
        lambda db: Reads.notice_page(db, NoticeFilter(zone=ZONES[1]), None, 100, None),
        "notices_zone_order",
    ),
    "upcoming, time unknown": (
        lambda db: Reads.notice_page(db, NoticeFilter(status="scheduled"), None, 100, "unknown"),
        "notices_order",
    ),
    "instances": (
        lambda db: Reads.instance_page(db, InstanceQuery(limit=100, now=NOW)),
        "instances_order",
    ),
    "a zone's instances": (
        lambda db: Reads.instance_page(db, InstanceQuery(zone=ZONES[2], limit=100, now=NOW)),
        "instances_zone_order",
    ),
    "one instance and its notices (eligible)": (
        lambda db: Reads.instances_in_force(db, ["vm-0042"]),
        "instances_name",
    ),
    "one instance's notices": (
        lambda db: Reads.notices(db, NoticeFilter(instance="vm-0040"), True),
        "notices_instance",
    ),
    "the few silent instances": (
        lambda db: Reads.instance_page(
            db, InstanceQuery(state="silent", limit=100, now=at(2).timestamp())
        ),
        "instances_silent_at",
    ),
    "retired instances": (
        lambda db: Reads.instance_page(db, InstanceQuery(state="retired", limit=100, now=NOW)),
        "instances_retired",
    ),
    # Its sources read first, then their events by the (source, id) key: the audit log
    # keeps no index of names (step 12).
    "one instance's audit log": (
        lambda db: Reads.events(db, EventQuery(instance="vm-0040")),
        "sqlite_autoindex_events_1",
    ),
    "one instance's heartbeats": (
        lambda db: Reads.events(
            db, EventQuery(instance="vm-0040", type="io.maintenancebridge.agent.heartbeat")
        ),
        "sqlite_autoindex_events_1",
    ),
    "instances turning silent now (summary)": (
        lambda db: tallies.silent_by(db, NOW),
        "silent_tallies",
    ),
}


async def test_the_main_reads_use_their_indexes(store: Store, store_url: str) -> None:
    """EXPLAIN of every statement of the main reads at a fleet's proportions: none reads a
    whole table of instances, notices or events (SQLite: a SCAN not through an index;
    PostgreSQL, told to avoid them as it would rightly do for tables this small: a Seq
    Scan), and on SQLite the first statement of each seeks the index named above.
    PostgreSQL's choice among indexes follows its statistics, so at this size it may sort
    a hundred rows instead: tests/fleet/test_postgres_store.py checks its plans at 20,000
    instances."""
    vms = [gce_vm(f"vm-{i:04d}", zone=ZONES[i % len(ZONES)]) for i in range(2000)]
    bodies = [heartbeat(vm, at(0)) for vm in vms]
    bodies += [
        transition(vm, f"n-{i}", Status.SCHEDULED, at(0), not_before=at(60 + i))
        for i, vm in enumerate(vms)
        if i % 20 == 0
    ]
    for start in range(0, len(bodies), 500):
        await store.ingest(batch(*bodies[start : start + 500]))
    postgres = not store_url.startswith("sqlite")

    def plans(db: Any) -> dict[str, list[str]]:
        db.execute("ANALYZE")
        if postgres:
            db.execute("SET enable_seqscan = off")
        found: dict[str, list[str]] = {}
        for name, (read, _index) in MAIN_READS.items():
            capture = Capture(db)
            read(capture)
            found[name] = []
            for statement, params in capture.statements:
                prefix = "EXPLAIN " if postgres else "EXPLAIN QUERY PLAN "
                rows = db.execute(prefix + statement, params).fetchall()
                found[name].append("\n".join(str(row[-1]) for row in rows))
        if postgres:
            db.execute("RESET enable_seqscan")
        return found

    found = await store._read(plans)  # type: ignore[attr-defined]
    whole = re.compile(r"Seq Scan on (instances|notices|events)|SCAN (instances|notices|events)$")
    for name, (_read, index) in MAIN_READS.items():
        # A read of several statements (an instance's sources, then their events) uses its
        # index in one of them.
        assert postgres or any(index in plan for plan in found[name]), (name, found[name])
        for plan in found[name]:
            assert not [line for line in plan.splitlines() if whole.search(line.strip())], (
                name,
                plan,
            )


async def test_pages_of_the_few_silent_instances_list_each_once_in_order(store: Store) -> None:
    """SQLite reads them through the index of when each turns silent (few of many), the
    unfiltered list walks its order: the pages are the same."""
    vms = [gce_vm(f"vm-{i:03d}") for i in range(40)]
    await store.ingest(batch(*(heartbeat(vm, at(59)) for vm in vms)))  # reporting at NOW
    silent = [f"vm-{i:03d}s" for i in range(3, 40, 4)]  # among them in the list's order
    await store.ingest(batch(*(heartbeat(gce_vm(name), at(10)) for name in ["early", *silent])))
    seen: list[str] = []
    cursor = None
    while True:
        query = InstanceQuery(state="silent", cursor=cursor, limit=3, now=NOW)
        page = await store.instance_page(query)
        seen += [row["name"] for row in page.rows]
        if page.next is None:
            break
        cursor = page.next
    assert seen == sorted(["early", *silent])


async def test_upcoming_with_no_known_start_finds_only_those(store: Store) -> None:
    vm = gce_vm("web-1")
    await store.ingest(
        batch(
            transition(vm, "known", Status.SCHEDULED, at(0), not_before=at(30)),
            transition(vm, "unknown", Status.SCHEDULED, at(0)),
            transition(gce_vm("web-2"), "started", Status.STARTED, at(0)),
        )
    )
    scheduled = NoticeFilter(status="scheduled")
    unknown = await store.notice_page(scheduled, cursor=None, limit=10, starts="unknown")
    assert [n["notice_id"] for n in unknown.rows] == ["unknown"]
    soon = await store.notice_page(scheduled, cursor=None, limit=10, starts=at(60).timestamp())
    assert [n["notice_id"] for n in soon.rows] == ["known"]


async def test_the_api_pages_with_a_next_cursor_and_refuses_a_forged_one(tmp_path: Path) -> None:
    raw = {
        "fleet": {
            "listener": {"port": 0},
            "store": {"url": f"sqlite://{tmp_path / 'fleet.sqlite3'}"},
            "api": {"page_size": 3},
        }
    }
    service = FleetService(parse_fleet_config(raw))
    async with service.running(), httpx.AsyncClient(base_url=service.url) as http:
        await service.store.ingest(batch(*(heartbeat(gce_vm(f"vm-{i}"), at(0)) for i in range(5))))
        first = await http.get("/v1/fleet/instances")
        assert first.json()["count"] == 3
        following = first.json()["next"]
        assert first.headers["Fleet-Next-Cursor"] == following
        assert 'rel="next"' in first.headers["Link"]
        second = (await http.get("/v1/fleet/instances", params={"cursor": following})).json()
        assert [i["name"] for i in second["instances"]] == ["vm-3", "vm-4"]
        assert second["next"] is None
        forged = await http.get("/v1/fleet/instances", params={"cursor": "bm90IGEgY3Vyc29y"})
        assert forged.status_code == 400
        assert "cursor" in forged.json()["error"]
        too_many = await http.get("/v1/fleet/notices", params={"limit": "4"})
        assert too_many.status_code == 400
        assert (await http.get("/v1/fleet/rejected")).json()["next"] is None


def test_a_cursor_is_opaque_and_checked() -> None:
    assert paging.decode(paging.encode(["web-1", "//x"]), 2) == ["web-1", "//x"]
    for bad in ("!!", paging.encode([1]), "x" * 5000):
        with pytest.raises(paging.BadCursor):
            paging.decode(bad, 2)
