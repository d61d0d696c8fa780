"""Retention (bridge/fleet/retention.py) on both stores: heartbeats go long before the rest
of the audit log, refused inputs are bounded in age and count, silent instances are retired
(never deleted) and come back with their next event, and pruning runs in short batches that
let ingest through between them.

PostgreSQL is a real server (tests/fleet/postgres_server.py: skipped without its binaries,
failing under CI=true). The pruner's clock is a parameter: the rows are received "days ago"
by giving their batches old receive times, never by waiting.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from bridge.fleet.config import parse_fleet_config
from bridge.fleet.retention import DAY, FleetRetention, Prunable, Pruner
from bridge.fleet.service import build_store
from bridge.fleet.store import Batch, EventQuery, NoticeFilter, Refused
from bridge.infra.validation import ConfigError
from bridge.pipeline.model import Status
from tests.fleet import world
from tests.fleet.capture import Capture
from tests.fleet.conftest import FleetFactory
from tests.fleet.factories import T0, batch, gce_vm, heartbeat, transition
from tests.fleet.world import FLEET

pytest_plugins = ["tests.fleet.postgres_server"]

WEB, DB = gce_vm("web-1"), gce_vm("db-1")


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "sqlite":
        url = f"sqlite://{tmp_path / 'fleet.sqlite3'}"
    else:
        url = request.getfixturevalue("postgres_url")
    store = build_store(url)
    await store.open()
    assert isinstance(store, Prunable)
    yield store
    await store.close()


def days_ago(now: datetime, days: float) -> datetime:
    return now - timedelta(days=days)


def pruner(store: Any, now: datetime, **policy: Any) -> tuple[Pruner, list[float]]:
    """A pruner at `now` whose pauses are recorded instead of slept."""
    pauses: list[float] = []

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    return Pruner(store, FleetRetention(**policy), clock=now.timestamp, sleep=pause), pauses


def record_writes(store: Any, note: Callable[[int], object]) -> None:
    """`note` each of the store's write transactions that deletes (rows it returned) as it
    ends (the retirement's walk returns how far it went too: not noted)."""
    write = store.transaction

    async def noted(fn: Callable[[Any], Any]) -> Any:
        done = await write(fn)
        if isinstance(done, int):
            note(done)
        return done

    store.transaction = noted


async def audit_types(store: Any) -> list[str]:
    page = await store.events(EventQuery(limit=1000))
    return [msgspec.json.decode(row[3])["type"].rsplit(".", 1)[-1] for row in page.rows]


async def test_heartbeats_go_first_and_the_rest_after_its_own_retention(store: Any) -> None:
    now = T0 + timedelta(days=500)
    scheduled = transition(DB, "n-1", Status.SCHEDULED, T0, not_before=T0 + timedelta(hours=1))
    await store.ingest(batch(scheduled, heartbeat(DB, T0), received=T0))  # 500 days ago
    old_beats = [heartbeat(WEB, days_ago(now, 10), sequence=i) for i in range(5)]
    await store.ingest(batch(*old_beats, received=days_ago(now, 10)))
    done = transition(DB, "n-1", Status.COMPLETED, days_ago(now, 20))
    await store.ingest(batch(done, received=days_ago(now, 20)))
    fresh = heartbeat(WEB, days_ago(now, 1), sequence=9)
    await store.ingest(batch(fresh, received=days_ago(now, 1)))

    report = await pruner(store, now, retire_after_days=1000)[0].run_pass()

    # 500 days: everything of then goes (on PostgreSQL its month's partition, whole);
    # 10-day-old heartbeats go; the rest stays.
    assert report.heartbeats == 6
    if store.dialect == "sqlite":
        assert report.events == 1
    else:  # its month, and the empty ones after it made ahead at open
        assert (report.events, report.partitions >= 1) == (0, True)
    assert await audit_types(store) == ["completed", "heartbeat"]
    (notice,) = await store.notices(NoticeFilter(), in_force=False)
    assert notice["status"] == "completed"  # the state is kept; only its history is pruned
    (web,) = [i for i in await store.instances() if i["name"] == "web-1"]
    assert web["last_heartbeat"] == days_ago(now, 1).timestamp()


async def test_the_kept_counts_follow_what_retention_removes_and_retires(store: Any) -> None:
    now = T0 + timedelta(days=500)
    scheduled = transition(DB, "n-1", Status.SCHEDULED, T0, not_before=T0 + timedelta(hours=1))
    await store.ingest(batch(scheduled, heartbeat(DB, T0), received=T0))  # a month dropped
    beats = [heartbeat(WEB, days_ago(now, 10), sequence=i) for i in range(5)]
    await store.ingest(batch(*beats, received=days_ago(now, 10)))
    refused = [Refused(f"{{bad {i}".encode(), "not JSON") for i in range(4)]
    await store.ingest(
        Batch(ingest="kafka", received_at=days_ago(now, 60).timestamp(), refused=refused)
    )
    await store.ingest(batch(heartbeat(WEB, days_ago(now, 1), sequence=9), received=now))

    report = await pruner(store, now)[0].run_pass()
    assert (report.heartbeats, report.retired) == (6, 1)  # db-1 not heard from since T0

    def recount(db: Any) -> dict[str, int]:
        found = {}
        for name, query in (
            ("events", "SELECT COUNT(*) FROM events"),
            ("instances", "SELECT COUNT(*) FROM instances"),
            ("notices", "SELECT COUNT(*) FROM notices"),
            ("notices_in_force", "SELECT COUNT(*) FROM notices WHERE rank < 2"),
            ("rejected", "SELECT COUNT(*) FROM rejected"),
            ("instances_retired", "SELECT COUNT(*) FROM instances WHERE retired_at IS NOT NULL"),
        ):
            (found[name],) = db.execute(query).fetchone()
        return found

    counts = await store.counts()
    assert counts == await store.transaction(recount)
    assert (counts["events"], counts["rejected"], counts["instances_retired"]) == (1, 0, 1)


async def test_pruning_runs_in_short_batches_with_a_pause_between(store: Any) -> None:
    now = T0 + timedelta(days=30)
    beats = [heartbeat(WEB, T0 + timedelta(seconds=i), sequence=i) for i in range(25)]
    await store.ingest(batch(*beats, received=T0))
    deleted: list[int] = []
    record_writes(store, deleted.append)
    prune, pauses = pruner(store, now, batch_rows=10, batch_pause=0.25, batch_seconds=0)
    assert (await prune.run_pass()).heartbeats == 25
    assert deleted[:3] == [10, 10, 5]  # one transaction each
    assert max(deleted) <= 10
    # Between full batches only; PostgreSQL then prunes the 25 de-duplication keys too.
    assert pauses == [0.25, 0.25] * (1 if store.dialect == "sqlite" else 2)


async def test_batches_start_small_and_shrink_when_a_transaction_holds_the_writer_too_long(
    store: Any,
) -> None:
    """On a busy database one batch of `batch_rows` may hold the writer for a second: a
    pass starts at 100 rows and doubles while batches are quick, and a slow one cuts the
    next to what fits `batch_seconds`."""
    now = T0 + timedelta(days=30)
    beats = [heartbeat(WEB, T0 + timedelta(seconds=i), sequence=i) for i in range(2000)]
    await store.ingest(batch(*beats, received=T0))
    deleted: list[int] = []
    record_writes(store, deleted.append)
    # Three quick batches, a slow one, a slowish one, then quick ones.
    took = iter([0.001] * 3 + [1.0, 0.1] + [0.001] * 1000)
    clock, calls = 0.0, 0

    def timer() -> float:  # called before and after each transaction
        nonlocal clock, calls
        calls += 1
        if calls % 2 == 0:
            clock += next(took)
        return clock

    async def pause(_seconds: float) -> None:
        pass

    policy = FleetRetention(batch_rows=1000, batch_seconds=0.05)
    prune = Pruner(store, policy, clock=now.timestamp, sleep=pause, timer=timer)
    assert (await prune.run_pass()).heartbeats == 2000
    # 100, 200, 400 quick; 800 took 1 s: 40 fit 50 ms, but never fewer than 100; 100 took
    # 0.1 s: 100 again; then a quick one lets the next double.
    assert deleted[:7] == [100, 200, 400, 800, 100, 100, 200]


async def test_ingest_gets_through_between_the_batches(store: Any) -> None:
    now = T0 + timedelta(days=30)
    beats = [heartbeat(WEB, T0 + timedelta(seconds=i), sequence=i) for i in range(200)]
    await store.ingest(batch(*beats, received=T0))
    order: list[str] = []
    record_writes(store, lambda _rows: order.append("prune"))
    pauses = 0

    async def pause(seconds: float) -> None:
        nonlocal pauses
        pauses += 1
        await asyncio.sleep(0)  # the loop runs whoever waits: here, the ingest

    prune = Pruner(store, FleetRetention(batch_rows=20), clock=now.timestamp, sleep=pause)

    async def ingest() -> None:
        await asyncio.sleep(0)
        await store.ingest(batch(heartbeat(DB, now, sequence=1), received=now))
        order.append("ingest")

    await asyncio.gather(prune.run_pass(), ingest())
    assert "ingest" in order[:3]  # after the first batch at the latest, not after the pass
    assert pauses >= 10  # 200 heartbeats in batches of 20 (and their keys on PostgreSQL)


async def test_refused_inputs_are_bounded_in_age_and_in_count(store: Any) -> None:
    now = T0 + timedelta(days=100)
    for age, count in ((60, 3), (1, 150)):
        received = days_ago(now, age).timestamp()
        refused = [Refused(f"{{bad {age}-{i}".encode(), "not JSON") for i in range(count)]
        await store.ingest(Batch(ingest="kafka", received_at=received, refused=refused))
    report = await pruner(store, now, rejected_rows=100, retire_after_days=1000)[0].run_pass()
    assert report.rejected == 3 + 50
    kept = await store.rejected(limit=1000)
    assert len(kept) == 100
    assert kept[0]["body"] == "{bad 1-149"  # the newest ones stay


async def test_silent_instances_are_retired_not_deleted_and_return_when_heard(
    store: Any,
) -> None:
    now = T0 + timedelta(days=45)
    received = now - timedelta(days=2)  # heard from no later than received (liveness)
    await store.ingest(batch(heartbeat(WEB, T0), heartbeat(DB, received), received=received))
    report = await pruner(store, now)[0].run_pass()
    assert report.retired == 1
    rows = {i["name"]: i for i in await store.instances()}
    assert rows["web-1"]["retired_at"] == now.timestamp()
    assert rows["db-1"]["retired_at"] is None
    assert (await pruner(store, now)[0].run_pass()).retired == 0  # once

    late = heartbeat(WEB, T0 - timedelta(days=1), sequence=7)  # late, and old
    await store.ingest(batch(late, received=now))
    assert {i["name"]: i for i in await store.instances()}["web-1"]["retired_at"] is not None
    await store.ingest(batch(heartbeat(WEB, now, sequence=8), received=now))
    assert {i["name"]: i for i in await store.instances()}["web-1"]["retired_at"] is None


async def test_the_api_shows_a_retired_instance_and_it_is_never_eligible(
    fleet_service: FleetFactory,
) -> None:
    # The world's `quiet-1` last sent an hour ago; here anything silent for 30 min retires.
    async with (
        fleet_service(retention={"retire_after_days": 30 / (24 * 60)}) as service,
        httpx.AsyncClient(base_url=service.url) as http,
    ):
        body = b"[" + b",".join(FLEET) + b"]"
        headers = {"content-type": "application/cloudevents-batch+json"}
        assert (await http.post("/v1/events", content=body, headers=headers)).status_code == 200
        assert service.pruner is not None
        await service.pruner.run_pass()
        listed = (await http.get("/v1/fleet/instances?state=retired")).json()
        (quiet,) = listed["instances"]
        assert (quiet["name"], quiet["state"]) == ("quiet-1", "retired")
        assert quiet["state_reason"] == "not heard from for 0 days"
        assert isinstance(quiet["retired_at"], str)  # RFC 3339, as every new time field
        summary = (await http.get("/v1/fleet/summary")).json()["instances"]
        assert summary["retired"] == 1
        assert summary["total"] == summary["reporting"] + summary["silent"] + 1
        silent = (await http.get("/v1/fleet/instances?state=silent")).json()["instances"]
        assert "quiet-1" not in [i["name"] for i in silent]  # retired, not silent
        metrics = (await http.get("/metrics")).text
        assert 'fleet_instances{state="retired"} 1' in metrics
        eligible = (await http.get("/v1/fleet/eligible?instance=quiet-1")).json()
        (answer,) = eligible["candidates"]
        assert (answer["eligible"], answer["reason"]) == (
            False,
            "retired: not heard from for 0 days",
        )


async def test_the_summary_and_metrics_count_retired_instances_apart_from_the_silent(
    fleet_service: FleetFactory,
) -> None:
    """A retired VM is a deleted one, not an alarm: `by_version` (to follow a rollout) and
    `fleet_instances` count it under `retired`, and only the truly silent under `silent`."""
    lull = heartbeat(gce_vm("lull-1"), world.minutes(-10))  # silent, heard 10 min ago
    async with (
        fleet_service(retention={"retire_after_days": 30 / (24 * 60)}) as service,
        httpx.AsyncClient(base_url=service.url) as http,
    ):
        assert service.pruner is not None
        await service.pruner.stop()  # its first pass, at the start, would race this one
        body = b"[" + b",".join([*FLEET, lull]) + b"]"
        headers = {"content-type": "application/cloudevents-batch+json"}
        assert (await http.post("/v1/events", content=body, headers=headers)).status_code == 200
        assert (await service.pruner.run_pass()).retired == 1  # quiet-1, an hour ago
        summary = (await http.get("/v1/fleet/summary")).json()["instances"]
        assert {k: summary[k] for k in ("total", "reporting", "silent", "retired")} == {
            "total": 6,
            "reporting": 4,
            "silent": 1,
            "retired": 1,
        }
        (version,) = summary["by_version"].values()  # every sidecar here runs this build
        assert version == {"total": 6, "reporting": 4, "silent": 1, "retired": 1}
        metrics = (await http.get("/metrics")).text
        for state, n in (("reporting", 4), ("silent", 1), ("retired", 1)):
            assert f'fleet_instances{{state="{state}"}} {n}' in metrics
        assert 'table="instances_retired"' not in metrics  # a state, not a table


def test_the_retention_settings_are_validated_with_their_key_named() -> None:
    defaults = parse_fleet_config({}).retention
    assert (defaults.events_days, defaults.heartbeats_days, defaults.batch_rows) == (400, 7, 1000)
    assert defaults.retire_after_days * DAY == 30 * DAY
    for table, problem in (
        ({"heartbeats_days": 500}, "fleet.retention.heartbeats_days: must not exceed events_days"),
        ({"events_days": 0}, "fleet.retention.events_days"),
        ({"batch_rows": 0}, "fleet.retention.batch_rows"),
        ({"keep": 1}, "fleet.retention"),
    ):
        with pytest.raises(ConfigError) as caught:
            parse_fleet_config({"fleet": {"retention": table}})
        assert problem in str(caught.value), str(caught.value)


async def test_the_retirement_walks_the_instances_a_batch_at_a_time(store: Any) -> None:
    now = T0 + timedelta(days=45)
    vms = [gce_vm(f"vm-{i:03d}") for i in range(250)]
    for recent in (True, False):  # one in three heard from two days ago, the rest at T0
        at = now - timedelta(days=2) if recent else T0
        heard = [heartbeat(vm, at) for i, vm in enumerate(vms) if (i % 3 == 0) == recent]
        await store.ingest(batch(*heard, received=at))
    walked: list[Any] = []
    write = store.transaction

    async def noted(fn: Callable[[Any], Any]) -> Any:
        done = await write(fn)
        if isinstance(done, tuple):
            walked.append(done)
        return done

    store.transaction = noted
    prune = pruner(store, now, batch_rows=100, batch_seconds=0)[0]
    assert (await prune.run_pass()).retired == sum(1 for i in range(250) if i % 3)
    assert len(walked) == 3  # 100 + 100 + 50 instances, one transaction each
    assert walked[-1][1] is None
    rows = {i["name"]: i["retired_at"] for i in await store.instances()}
    assert [name for name, at in rows.items() if at is None] == [
        f"vm-{i:03d}" for i in range(0, 250, 3)
    ]


async def test_every_sqlite_batch_seeks_an_index_and_sorts_nothing(tmp_path: Path) -> None:
    """A batch runs inside the writer's transaction, an ingest waiting behind it: it must
    not scan or sort a large table. SQLite has no statistics (the store never runs
    ANALYZE), so this is the plan the store runs. (PostgreSQL's plans of the same
    statements at 20,000 instances: tests/fleet/test_postgres_store.py.)"""
    store: Any = build_store(f"sqlite://{tmp_path / 'fleet.sqlite3'}")
    await store.open()
    try:
        now = T0 + timedelta(days=500)
        vms = [gce_vm(f"vm-{i:03d}") for i in range(300)]
        beats = [heartbeat(vm, T0, sequence=n) for n in range(3) for vm in vms]
        notices = [transition(vm, f"n-{vm.name}", Status.SCHEDULED, T0) for vm in vms[::10]]
        await store.ingest(batch(*beats, *notices, received=T0))
        refused = [Refused(f"{{bad {i}".encode(), "not JSON") for i in range(150)]
        await store.ingest(Batch(ingest="kafka", received_at=T0.timestamp(), refused=refused))
        captured: list[Capture] = []
        write = store.transaction

        async def captures(fn: Callable[[Any], Any]) -> Any:
            def run(db: Any) -> Any:
                captured.append(Capture(db))
                return fn(captured[-1])

            return await write(run)

        store.transaction = captures
        report = await pruner(store, now, rejected_rows=100)[0].run_pass()
        assert (report.heartbeats, report.events, report.rejected, report.retired) == (
            900,
            30,
            150,
            300,
        )
        store.transaction = write

        def plans(db: Any) -> list[tuple[str, str]]:
            found = []
            for capture in captured:
                for statement, params in capture.statements:
                    rows = db.execute("EXPLAIN QUERY PLAN " + statement, params).fetchall()
                    found += [(statement, str(row[-1])) for row in rows]
            return found

        found = await store.transaction(plans)
    finally:
        await store.close()
    assert {statement.split()[0] for statement, _ in found} >= {"DELETE", "UPDATE"}
    whole = re.compile(r"^SCAN (events|instances|rejected)$|TEMP B-TREE")
    # Walking the oldest rows in sequence (the table's own order) stops after the limit.
    oldest = re.compile(r"FROM (events|rejected) ORDER BY seq LIMIT [?(]")
    assert not [(s, plan) for s, plan in found if whole.search(plan) and not oldest.search(s)], (
        found
    )
