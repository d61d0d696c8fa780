"""Restarts: the watcher checkpoint in the spool database makes a restart neither lose a
transition that happened while the bridge was down nor announce one twice."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bridge.runner import ProviderName
from bridge.simulator import Simulator
from tests.support import CheckedSink, running_bridge

AZURE: tuple[ProviderName, ...] = ("azure",)


async def test_gce_event_under_way_across_a_restart(gce_sim: Simulator, tmp_path: Path) -> None:
    sink = CheckedSink("memory")
    async with running_bridge(gce_sim, tmp_path, sink=sink) as run:
        gce_sim.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
        (started,) = await run.wait_for(1)
    async with running_bridge(gce_sim, tmp_path, sink=CheckedSink("memory")) as run:
        assert (await run.settle(0.8)) == []  # the migration is not announced again
        gce_sim.gce.set("instance/maintenance-event", "NONE")
        (completed,) = await run.wait_for(1)
    assert completed["data"]["status"] == "completed"
    assert completed["data"]["notice_id"] == started["data"]["notice_id"]


async def test_gce_event_that_ended_while_down_is_completed_on_start(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    async with running_bridge(gce_sim, tmp_path) as run:
        gce_sim.gce.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
        (started,) = await run.wait_for(1)
    gce_sim.gce.set("instance/maintenance-event", "NONE")
    async with running_bridge(gce_sim, tmp_path, sink=CheckedSink("memory")) as run:
        (completed,) = await run.wait_for(1)
        assert (await run.settle()) == [completed]
    assert (completed["data"]["kind"], completed["data"]["status"]) == ("terminate", "completed")
    assert completed["data"]["notice_id"] == started["data"]["notice_id"]


async def test_azure_event_started_while_down(azure_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(azure_sim, tmp_path, AZURE) as run:
        event_id = azure_sim.azure.add_event(event_type="Reboot", auto_complete=False)
        (_scheduled,) = await run.wait_for(1)
    azure_sim.azure.start_event(event_id)
    async with running_bridge(azure_sim, tmp_path, AZURE, sink=CheckedSink("m")) as run:
        (started,) = await run.wait_for(1)
        assert (await run.settle()) == [started]
        azure_sim.azure.remove_event(event_id)
        await run.wait_for(2)
    assert run.sink.summary() == [("reboot", "started"), ("reboot", "completed")]


async def test_azure_event_that_ran_while_down_is_completed_not_cancelled(
    azure_sim: Simulator, tmp_path: Path
) -> None:
    async with running_bridge(azure_sim, tmp_path, AZURE) as run:
        event_id = azure_sim.azure.add_event(event_type="Reboot", not_before_in=0.5)
        await run.wait_for(1)
    azure_sim.azure.remove_event(event_id)  # it rebooted the VM while we were down
    await asyncio.sleep(1.2)  # NotBefore has one-second resolution: make sure it passed
    async with running_bridge(azure_sim, tmp_path, AZURE, sink=CheckedSink("m")) as run:
        (completed,) = await run.wait_for(1)
    assert completed["data"]["status"] == "completed"
    assert completed["data"]["outcome_inferred"] is True  # concluded, not seen


async def test_undelivered_events_are_delivered_after_restart(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    from bridge.sinkapi import Retry

    down = CheckedSink("memory")
    down.fail_next(*[Retry("receiver down")] * 10_000)
    async with running_bridge(gce_sim, tmp_path, sink=down) as run:
        gce_sim.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
        await run.settle(0.8)
        assert down.events == []
    async with running_bridge(gce_sim, tmp_path, sink=CheckedSink("memory")) as run:
        (event,) = await run.wait_for(1)
        assert (await run.settle()) == [event]
    assert event["data"]["status"] == "started"
