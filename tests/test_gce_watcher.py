"""The GCE watcher against the simulator, through the real pipeline (spool, dispatcher).

Every row of the mapping table for GCE, and the hostile inputs: 503 storms, dropped
connections, answers without `Metadata-Flavor`, redirects, malformed bodies. Each case
checks the right events arrive exactly once and nothing crashes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import cast

import pytest
from cloudevents.core.v1.event import CloudEvent

from bridge.config import parse_config
from bridge.pipeline.watchers.base import Update
from bridge.providers.gce import watcher as gce
from bridge.simulator import Simulator
from bridge.sinkapi import Result
from tests.support import CheckedSink, eventually, running_bridge

UPCOMING_CAMEL = {
    "maintenanceType": "SCHEDULED",
    "canReschedule": "true",
    "latestWindowStartTime": "2026-12-01T21:56:21Z",
    "maintenanceStatus": "PENDING",
    "windowEndTime": "2026-12-02T01:56:20Z",
    "windowStartTime": "2026-12-01T21:56:26Z",
}


async def test_live_migration_is_started_then_completed(gce_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(gce_sim, tmp_path) as run:
        await run.settle(0.3)
        gce_sim.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
        started = (await run.wait_for(1))[0]
        gce_sim.gce.set("instance/maintenance-event", "NONE")
        events = await run.wait_for(2)
        assert run.sink.summary() == [("live-migrate", "started"), ("live-migrate", "completed")]
        assert (await run.settle()) == events  # exactly once

    assert started["type"] == "io.maintenancebridge.maintenance.started"
    assert started["source"] == (
        "//compute.googleapis.com/projects/sim-project/zones/us-central1-a/instances/sim-vm-1"
    )
    assert started["subject"] == "sim-vm-1"
    data = started["data"]
    assert data["not_before_estimated"] is True
    assert data["raw"]["value"] == "MIGRATE_ON_HOST_MAINTENANCE"
    assert data["affected"] == ["sim-vm-1"]
    assert data["instance"]["project"] == "sim-project"
    assert data["instance"]["zone"] == "us-central1-a"
    assert data["instance"]["location"] == "us-central1"
    completed = events[1]
    assert completed["data"]["notice_id"] == data["notice_id"]
    assert completed["id"] != started["id"]


async def test_not_before_is_estimated_from_the_documented_notice(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    from datetime import datetime

    async with running_bridge(gce_sim, tmp_path) as run:
        gce_sim.gce.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
        (event,) = await run.wait_for(1)
    data = event["data"]
    assert data["kind"] == "terminate"
    observed = datetime.fromisoformat(event["time"])
    not_before = datetime.fromisoformat(data["not_before"])
    assert abs((not_before - observed).total_seconds() - 3600) < 1


async def test_an_event_under_way_at_start_is_announced(gce_sim: Simulator, tmp_path: Path) -> None:
    gce_sim.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
    async with running_bridge(gce_sim, tmp_path) as run:
        await run.wait_for(1)
        assert run.sink.summary() == [("live-migrate", "started")]


async def test_the_key_itself_is_long_polled(gce_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(gce_sim, tmp_path) as run:
        await run.settle(0.5)
    paths = [r.path for r in gce_sim.requests]
    assert "/computeMetadata/v1/instance/maintenance-event" in paths
    assert "/computeMetadata/v1/instance/" not in paths  # never the parent directory
    waits = [r for r in gce_sim.requests if r.query.get("wait_for_change") == "true"]
    assert waits
    assert all("last_etag" in r.query and "timeout_sec" in r.query for r in waits)
    assert all(r.headers.get("Metadata-Flavor") == "Google" for r in gce_sim.requests)


async def test_unknown_maintenance_value_is_an_event_of_unknown_kind(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    async with running_bridge(gce_sim, tmp_path) as run:
        gce_sim.gce.set("instance/maintenance-event", "SOMETHING_NEW")
        await run.wait_for(1)
        assert run.sink.summary() == [("unknown", "started")]


async def test_spot_preemption(gce_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(gce_sim, tmp_path) as run:
        gce_sim.gce.set("instance/preempted", "TRUE")
        (event,) = await run.wait_for(1)
        assert run.sink.summary() == [("preempt", "started")]
        assert (await run.settle()) == [event]


@pytest.mark.parametrize("case", ["camel", "snake"])
@pytest.mark.parametrize("nothing", ["empty-object", "NONE", "404", "503"])
async def test_upcoming_maintenance_pending_ongoing_done(
    gce_sim: Simulator, tmp_path: Path, case: str, nothing: str
) -> None:
    gce_sim.gce.quirks.upcoming_case = case
    gce_sim.gce.quirks.upcoming_none = nothing
    async with running_bridge(gce_sim, tmp_path) as run:
        await run.settle(0.3)
        gce_sim.gce.set_upcoming_maintenance(dict(UPCOMING_CAMEL))
        (scheduled,) = await run.wait_for(1)
        gce_sim.gce.set_upcoming_maintenance({**UPCOMING_CAMEL, "maintenanceStatus": "ONGOING"})
        await run.wait_for(2)
        gce_sim.gce.set_upcoming_maintenance(None)
        events = await run.wait_for(3)
        assert (await run.settle()) == events
    assert [e["data"]["status"] for e in events] == ["scheduled", "started", "completed"]
    data = scheduled["data"]
    assert data["window"] == {
        "start": "2026-12-01T21:56:26Z",
        "end": "2026-12-02T01:56:20Z",
        "latest_start": "2026-12-01T21:56:21Z",
    }
    assert data["not_before"] == "2026-12-01T21:56:26Z"
    assert data["not_before_estimated"] is False
    assert data["can_reschedule"] is True
    assert len({e["data"]["notice_id"] for e in events}) == 1


async def test_upcoming_maintenance_that_disappears_while_pending_is_cancelled(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    async with running_bridge(gce_sim, tmp_path) as run:
        gce_sim.gce.set_upcoming_maintenance(dict(UPCOMING_CAMEL))
        await run.wait_for(1)
        gce_sim.gce.set_upcoming_maintenance(None)
        await run.wait_for(2)
        assert [s for _, s in run.sink.summary()] == ["scheduled", "cancelled"]


async def test_rescheduled_upcoming_maintenance_is_announced_again(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    async with running_bridge(gce_sim, tmp_path) as run:
        gce_sim.gce.set_upcoming_maintenance(dict(UPCOMING_CAMEL))
        await run.wait_for(1)
        moved = {**UPCOMING_CAMEL, "windowStartTime": "2026-12-03T21:56:26Z"}
        gce_sim.gce.set_upcoming_maintenance(moved)
        first, second = await run.wait_for(2)
    assert second["data"]["status"] == "scheduled"
    assert second["id"] != first["id"]
    assert second["data"]["notice_id"] == first["data"]["notice_id"]


async def test_503_storm_and_dropped_connections_lose_nothing(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    async with running_bridge(gce_sim, tmp_path) as run:
        await run.settle(0.3)
        gce_sim.faults.set(provider="gce", status_burst=(503, 30), drop=5)
        gce_sim.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
        await run.wait_for(1, timeout=20)
        gce_sim.faults.set(provider="gce", drop=3)
        gce_sim.gce.set("instance/maintenance-event", "NONE")
        events = await run.wait_for(2, timeout=20)
        assert (await run.settle()) == events
    assert run.sink.summary() == [("live-migrate", "started"), ("live-migrate", "completed")]


@pytest.mark.parametrize(
    ("fault", "cause"),
    [("missing_vendor_header", "missing-vendor-header"), ("redirect", "redirect")],
)
async def test_answers_without_the_vendor_header_or_redirects_are_refused(
    gce_sim: Simulator, tmp_path: Path, fault: str, cause: str
) -> None:
    gce_sim.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
    gce_sim.faults.set(provider="gce", **{fault: 3})
    async with running_bridge(gce_sim, tmp_path) as run:
        await run.wait_for(1, timeout=20)
        assert run.sink.summary() == [("live-migrate", "started")]
        errors = run.bridge.watchers["gce"]._client.stats.errors  # type: ignore[attr-defined]
        assert errors == {cause: 3}
    assert gce_sim.redirects_followed == 0
    assert not [r for r in gce_sim.requests if "redirect-target" in r.path]  # never followed


async def test_malformed_upcoming_maintenance_is_retried_not_guessed(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    gce_sim.gce.set_upcoming_maintenance(dict(UPCOMING_CAMEL))
    gce_sim.faults.set(provider="gce", malformed=4)
    async with running_bridge(gce_sim, tmp_path) as run:
        await run.wait_for(1, timeout=20)
        assert (await run.settle()) == run.sink.dicts()
        assert run.sink.summary() == [("live-migrate", "scheduled")]  # the VM's policy: MIGRATE
    assert run.sink.dicts()[0]["data"]["instance"]["project"] == "sim-project"


async def test_corrupted_plain_values_are_retried_not_announced(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    async with running_bridge(gce_sim, tmp_path) as run:
        await run.settle(0.3)
        gce_sim.faults.set(provider="gce", malformed=3)
        gce_sim.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
        await run.wait_for(1, timeout=20)
        assert (await run.settle()) == run.sink.dicts()
    assert run.sink.summary() == [("live-migrate", "started")]


async def test_metadata_host_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from bridge.infra.validation import validate
    from bridge.providers.gce.settings import GceSource

    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:8080")
    assert GceSource().resolved_url() == "http://127.0.0.1:8080/computeMetadata/v1/"
    explicit = validate(GceSource, {"metadata_url": "http://10.0.0.1/computeMetadata/v1"})
    assert explicit.resolved_url() == "http://10.0.0.1/computeMetadata/v1/"


def _long_polls(sim: Simulator, key: str) -> tuple[int, int]:
    """(answered, hanging) long polls of `key` the simulator has seen."""
    polls = [r for r in sim.requests if r.path.endswith(key) and "last_etag" in r.query]
    return sum(r.status is not None for r in polls), sum(r.status is None for r in polls)


async def test_a_key_polls_again_once_its_update_is_taken(
    gce_sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spool's commit runs on its own thread, which needs the GIL between its SQLite
    calls: the key's next long poll is sent once the runner took the update (asked for the
    next one), not while the notice is on its way to the disk and the sinks."""
    monkeypatch.setattr(gce, "_HANDLED_WAIT", 30.0)  # only the taking releases the key here
    config = parse_config({"source": {"gce": {"metadata_url": gce_sim.gce_url}}}).source.gce
    watcher = gce.GceWatcher(gce.new_client(config), config)
    updates = cast(AsyncGenerator[Update, None], watcher.watch())
    try:
        first = asyncio.ensure_future(anext(updates))
        await eventually(lambda: _long_polls(gce_sim, gce.MAINTENANCE_EVENT) == (0, 1))
        gce_sim.gce.set(gce.MAINTENANCE_EVENT, "MIGRATE_ON_HOST_MAINTENANCE")
        (notice,) = (await first).notices
        assert notice.status.value == "started"
        await asyncio.sleep(0.2)
        assert _long_polls(gce_sim, gce.MAINTENANCE_EVENT) == (1, 0)  # not polling yet

        second = asyncio.ensure_future(anext(updates))  # the runner asks for the next
        await eventually(lambda: _long_polls(gce_sim, gce.MAINTENANCE_EVENT) == (1, 1))
        gce_sim.gce.set(gce.MAINTENANCE_EVENT, "NONE")
        assert [n.status.value for n in (await second).notices] == ["completed"]
    finally:
        await updates.aclose()
        await watcher.aclose()


async def test_a_key_does_not_wait_for_ever_on_a_runner_that_is_busy(
    gce_sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner still busy with the update (a spool that keeps failing) does not keep the
    key from polling: a value that changed and changed back while no poll hung would come
    back with the ETag it had, and be missed."""
    monkeypatch.setattr(gce, "_HANDLED_WAIT", 0.05)
    config = parse_config({"source": {"gce": {"metadata_url": gce_sim.gce_url}}}).source.gce
    watcher = gce.GceWatcher(gce.new_client(config), config)
    updates = cast(AsyncGenerator[Update, None], watcher.watch())
    try:
        first = asyncio.ensure_future(anext(updates))
        await eventually(lambda: _long_polls(gce_sim, gce.MAINTENANCE_EVENT) == (0, 1))
        gce_sim.gce.set(gce.MAINTENANCE_EVENT, "MIGRATE_ON_HOST_MAINTENANCE")
        await first  # and the next update is not asked for
        await eventually(lambda: _long_polls(gce_sim, gce.MAINTENANCE_EVENT) == (1, 1))
    finally:
        await updates.aclose()
        await watcher.aclose()


async def test_a_notice_is_sent_before_the_runners_bookkeeping(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    """The commit wakes the dispatcher, whose send of the notice goes first; the counters,
    the notices in force, the log line and the actions follow at once, before the loop
    handles any other request or answer."""
    counted_when_sent: list[int] = []

    class Sink(CheckedSink):
        async def _publish(self, batch: Sequence[CloudEvent]) -> Result:
            counted_when_sent.append(run.bridge.supervision.notices_seen)
            return await super()._publish(batch)

    async with running_bridge(gce_sim, tmp_path, sink=Sink("memory")) as run:
        await run.settle(0.3)
        gce_sim.gce.set(gce.MAINTENANCE_EVENT, "MIGRATE_ON_HOST_MAINTENANCE")
        await run.wait_for(1)
        assert counted_when_sent == [0]  # on its way before the runner counted it
        assert run.bridge.supervision.notices_seen == 1  # and counted right after
