"""The Azure watcher against the simulator, through the real pipeline (spool, dispatcher).

Every Azure row of the mapping table, events for other VMs of the group, and the hostile
inputs: 5xx and 410 storms, 429 with Retry-After, dropped connections, malformed documents.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge.config import parse_config
from bridge.pipeline.model import Instance, Provider, Status
from bridge.providers.azure.watcher import AzureWatcher, new_client
from bridge.runner import ProviderName
from bridge.simulator import Simulator
from tests.support import running_bridge

AZURE: tuple[ProviderName, ...] = ("azure",)
VM = Instance(Provider.AZURE, "vm-id-1", "vm-1", "/subscriptions/s/vm-1", "/subscriptions/s/vm-1")


@pytest.mark.parametrize(
    ("event_type", "kind"),
    [
        ("Freeze", "freeze"),
        ("Reboot", "reboot"),
        ("Redeploy", "redeploy"),
        ("Preempt", "preempt"),
        ("Terminate", "delete"),
    ],
)
async def test_scheduled_started_completed(
    azure_sim: Simulator, tmp_path: Path, event_type: str, kind: str
) -> None:
    async with running_bridge(azure_sim, tmp_path, AZURE) as run:
        event_id = azure_sim.azure.add_event(event_type=event_type, duration=9, auto_complete=False)
        (scheduled,) = await run.wait_for(1)
        azure_sim.azure.start_event(event_id)
        await run.wait_for(2)
        azure_sim.azure.remove_event(event_id)
        events = await run.wait_for(3)
        assert (await run.settle()) == events
    assert run.sink.summary() == [(kind, "scheduled"), (kind, "started"), (kind, "completed")]
    assert {e["data"]["notice_id"] for e in events} == {event_id}
    data = scheduled["data"]
    assert data["provider"] == "azure"
    assert data["duration_seconds"] == 9
    assert data["origin"] == "platform"
    assert data["not_before"] is not None
    assert data["not_before_estimated"] is False
    assert data["raw"]["EventId"] == event_id
    assert scheduled["source"].startswith("/subscriptions/")
    assert scheduled["source"].endswith("/virtualMachines/sim-vm-1")
    assert data["instance"]["location"] == "westeurope"


async def test_cancelled_while_scheduled(azure_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(azure_sim, tmp_path, AZURE) as run:
        event_id = azure_sim.azure.add_event(event_type="Reboot", source="User")
        await run.wait_for(1)
        azure_sim.azure.remove_event(event_id)
        events = await run.wait_for(2)
    assert run.sink.summary() == [("reboot", "scheduled"), ("reboot", "cancelled")]
    assert events[0]["data"]["origin"] == "user"
    assert events[1]["data"]["notice_id"] == event_id
    assert "outcome_inferred" not in events[1]["data"]  # gone long before its NotBefore


async def test_a_freeze_whose_start_was_never_polled_completed_and_says_it_was_inferred(
    azure_sim: Simulator, tmp_path: Path
) -> None:
    """A Freeze pauses the VM: the bridge cannot poll while it runs, so it sees the event
    Scheduled, then gone. Its NotBefore passed: it ran (not: it was cancelled)."""
    async with running_bridge(azure_sim, tmp_path, AZURE) as run:
        event_id = azure_sim.azure.add_event(
            event_type="Freeze", not_before_in=1.0, auto_complete=False
        )
        (scheduled,) = await run.wait_for(1)
        azure_sim.faults.set(provider="azure", hang=True)  # the VM is paused: no poll answers
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while (event := azure_sim.azure.find(event_id)) and event.status != "Started":
            assert loop.time() < deadline, "the simulator never started the Freeze"
            await asyncio.sleep(0.05)
        azure_sim.azure.remove_event(event_id)  # the Freeze is over
        azure_sim.faults.set(provider="azure", hang=False)  # the VM runs again
        _, ended = await run.wait_for(2, timeout=20)
        assert (await run.settle()) == [scheduled, ended]
    assert run.sink.summary() == [("freeze", "scheduled"), ("freeze", "completed")]
    assert ended["data"]["notice_id"] == event_id
    assert ended["data"]["outcome_inferred"] is True
    assert "outcome_inferred" not in scheduled["data"]


def _watcher() -> AzureWatcher:
    """A watcher fed documents by hand (no simulator): the diff rule on its own."""
    config = parse_config({}).source.azure
    watcher = AzureWatcher(new_client(config), config, None)
    watcher.instance = VM
    return watcher


@pytest.mark.parametrize(
    ("seen", "approved", "inferred"),
    [
        # Approved by us: it starts at once, whatever its NotBefore says, so gone means ran.
        ("Scheduled", True, True),
        # Seen Started, then gone: Azure's way of saying completed, nothing to infer.
        ("Started", False, False),
    ],
)
def test_gone_within_one_run_is_completed(seen: str, approved: bool, inferred: bool) -> None:
    watcher = _watcher()
    event = {
        "EventId": "E1",
        "EventType": "Reboot",
        "EventStatus": seen,
        "Resources": [VM.name],
        "NotBefore": "Mon, 11 Apr 2033 22:26:58 GMT" if seen == "Scheduled" else "",
    }
    (first,) = watcher.diff(1, [event])
    if approved:
        watcher.approved.add("E1")  # what `approve` records after StartRequests answered 200
    (ended,) = watcher.diff(2, [])
    assert first.status == Status(seen.lower())
    assert ended.status == Status.COMPLETED
    assert ended.outcome_inferred is inferred
    assert watcher.approved == set()


async def test_hardware_failure_appears_directly_as_started(
    azure_sim: Simulator, tmp_path: Path
) -> None:
    async with running_bridge(azure_sim, tmp_path, AZURE) as run:
        azure_sim.azure.add_event(event_type="Reboot", status="Started", auto_complete=False)
        (started,) = await run.wait_for(1)
        assert (await run.settle()) == [started]
    assert run.sink.summary() == [("reboot", "started")]
    assert started["data"]["not_before"] is None


async def test_fields_changed_while_scheduled_are_announced_again(
    azure_sim: Simulator, tmp_path: Path
) -> None:
    async with running_bridge(azure_sim, tmp_path, AZURE) as run:
        event_id = azure_sim.azure.add_event(event_type="Redeploy", not_before_in=600)
        await run.wait_for(1)
        # The platform moves NotBefore: same EventId, new content, new incarnation.
        event = azure_sim.azure.find(event_id)
        assert event is not None
        event.not_before = "Mon, 11 Apr 2033 22:26:58 GMT"
        azure_sim.azure._changed()
        first, second = await run.wait_for(2)
        assert (await run.settle()) == [first, second]
    assert second["data"]["status"] == "scheduled"
    assert second["data"]["not_before"] == "2033-04-11T22:26:58Z"
    assert second["id"] != first["id"]


async def test_events_for_other_vms_are_ignored(azure_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(azure_sim, tmp_path, AZURE) as run:
        azure_sim.azure.add_event(event_type="Freeze", resources=["other-vm-1", "other-vm-2"])
        mine = azure_sim.azure.add_event(event_type="Freeze", resources=["other-vm-1", "SIM-VM-1"])
        (event,) = await run.wait_for(1)
        assert (await run.settle()) == [event]
    assert event["data"]["notice_id"] == mine
    assert event["data"]["affected"] == ["other-vm-1", "SIM-VM-1"]


async def test_freeze_sequence_of_the_vendor_page(tmp_path: Path) -> None:
    # Real speed, with the 15 min wait skipped: the Freeze then stays Started for its real 9 s,
    # many polls long (a sped-up clock would make it shorter than one poll on a busy machine).
    async with Simulator(provider="azure", scenario="azure-freeze", speed=1.0) as sim:
        sim.faults.set(provider="azure", rate_limit=False)
        sim.clock.advance(5)
        async with running_bridge(sim, tmp_path, AZURE) as run:
            await run.wait_for(1, timeout=10)
            sim.clock.advance(900)
            events = await run.wait_for(3, timeout=30)
    assert run.sink.summary() == [
        ("freeze", "scheduled"),
        ("freeze", "started"),
        ("freeze", "completed"),
    ]
    assert {e["data"]["notice_id"] for e in events} == {"C7061BAC-AFDC-4513-B24B-AA5F13A16123"}
    assert events[0]["subject"] == "WestNO_0"
    assert events[0]["data"]["affected"] == ["WestNO_0", "WestNO_1"]


@pytest.mark.parametrize("status", [500, 503, 410])
async def test_error_storms_lose_nothing(azure_sim: Simulator, tmp_path: Path, status: int) -> None:
    async with running_bridge(azure_sim, tmp_path, AZURE) as run:
        await run.settle(0.3)
        azure_sim.faults.set(provider="azure", status_burst=(status, 8), drop=2)
        event_id = azure_sim.azure.add_event(event_type="Reboot")
        await run.wait_for(1, timeout=20)
        azure_sim.azure.remove_event(event_id)
        events = await run.wait_for(2, timeout=20)
        assert (await run.settle()) == events
    assert run.sink.summary() == [("reboot", "scheduled"), ("reboot", "cancelled")]


async def test_rate_limit_is_honored(azure_sim: Simulator, tmp_path: Path) -> None:
    azure_sim.faults.set(provider="azure", rate_limit=True)
    async with running_bridge(azure_sim, tmp_path, AZURE, azure={"poll_interval": 0.2}) as run:
        azure_sim.azure.add_event(event_type="Freeze")
        await run.wait_for(1, timeout=20)
        await run.settle(1.0)
    assert len(run.sink.events) == 1


async def test_malformed_documents_are_retried(azure_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(azure_sim, tmp_path, AZURE) as run:
        await run.settle(0.3)
        azure_sim.faults.set(provider="azure", malformed=5)
        azure_sim.azure.add_event(event_type="Freeze")
        (event,) = await run.wait_for(1, timeout=20)
        assert (await run.settle()) == [event]
        errors = run.bridge.watchers["azure"]._client.stats.errors  # type: ignore[attr-defined]
        assert errors.get("malformed") == 5


async def test_requests_carry_the_metadata_header_and_api_version(
    azure_sim: Simulator, tmp_path: Path
) -> None:
    async with running_bridge(azure_sim, tmp_path, AZURE) as run:
        await run.settle(0.6)
    polls = [r for r in azure_sim.requests if r.path == "/metadata/scheduledevents"]
    assert len(polls) >= 2
    assert all(r.headers.get("Metadata") == "true" for r in azure_sim.requests)
    assert all(r.query.get("api-version") == "2020-07-01" for r in polls)
