# mypy: allow-untyped-calls
"""Azure approval: the real bridge POSTs StartRequests to the simulator, which records them.

The vendor-sample preset is checked against the vendor's own sample program run on the same
events; the leader rule with three bridges sharing one simulated group (AzureGroup).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bridge.actions.approval import VENDOR_SAMPLE, decide, is_leader
from bridge.actions.audit import APPROVED, HOOK_COMPLETED
from bridge.config import Approval, ApprovalRule
from bridge.runner import ProviderName
from bridge.simulator import Simulator, SimulatorThread
from tests.simulator import azure_sample
from tests.support import CheckedSink, eventually, running_bridge, running_group

AZURE: tuple[ProviderName, ...] = ("azure",)
PRESET = {"approval": {"preset": "vendor-sample"}}

# (EventId, EventType, EventSource, DurationInSeconds, EventStatus): what the sample decides
# differs along every one of these.
EVENTS = [
    ("00000000-0000-0000-0000-000000000001", "Reboot", "User", -1, "Scheduled"),
    ("00000000-0000-0000-0000-000000000002", "Reboot", "Platform", -1, "Scheduled"),
    ("00000000-0000-0000-0000-000000000003", "Freeze", "Platform", 5, "Scheduled"),
    ("00000000-0000-0000-0000-000000000004", "Freeze", "Platform", 9, "Scheduled"),
    ("00000000-0000-0000-0000-000000000005", "Freeze", "Platform", -1, "Scheduled"),
    ("00000000-0000-0000-0000-000000000006", "Freeze", "Platform", 0, "Scheduled"),
    ("00000000-0000-0000-0000-000000000007", "Redeploy", "User", 30, "Scheduled"),
    ("00000000-0000-0000-0000-000000000008", "Redeploy", "Platform", 8, "Scheduled"),
    ("00000000-0000-0000-0000-000000000009", "Reboot", "Platform", -1, "Started"),
    ("00000000-0000-0000-0000-000000000010", "Freeze", "User", 3, "Started"),
    ("00000000-0000-0000-0000-000000000011", "Terminate", "User", -1, "Scheduled"),
    ("00000000-0000-0000-0000-000000000012", "Preempt", "Platform", 5, "Scheduled"),
]


def publish(sim: Any) -> None:
    for event_id, event_type, source, duration, status in EVENTS:
        sim.azure.add_event(
            event_id=event_id,
            event_type=event_type,
            source=source,
            duration=duration,
            status=status,
            auto_complete=False,
        )


async def test_vendor_sample_preset_approves_exactly_what_the_sample_approves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SimulatorThread(provider="azure") as sample_sim, contextlib.redirect_stdout(sys.stderr):
        # IMDS allows 5 requests/s; the sample ignores the 429 its sixth POST would get
        sample_sim.faults.set(provider="azure", rate_limit=False)
        publish(sample_sim)
        monkeypatch.setattr(azure_sample, "metadata_url", sample_sim.azure_url + "scheduledevents")
        azure_sample.advanced_sample("-1")  # the vendor's program, one document
        by_the_sample = set(sample_sim.azure.approvals)
    assert by_the_sample == {EVENTS[i][0] for i in (0, 2, 5, 6, 10)}  # as the sample reads

    async with Simulator(provider="azure") as sim:
        sim.faults.set(provider="azure", rate_limit=False)
        async with running_bridge(sim, tmp_path, AZURE, settings=PRESET) as run:
            publish(sim)
            approved = await run.sink.wait_for_type(APPROVED, len(by_the_sample))
            await run.settle(1.0)
        assert set(sim.azure.approvals) == by_the_sample
        assert len(sim.azure.approvals) == len(by_the_sample)  # each once
    assert len(run.sink.of_type(APPROVED)) == len(by_the_sample)
    rules = {e["subject"]: e["data"]["rule"] for e in approved}
    assert rules[EVENTS[0][0]] == "preset vendor-sample[0]"
    assert rules[EVENTS[2][0]] == "preset vendor-sample[1]"
    assert {e["data"]["approved_by"] for e in approved} == {"sim-vm-1"}


def test_rules_match_in_order_and_durations_are_inclusive() -> None:
    config = Approval(
        rules=(
            ApprovalRule(event_types=("Reboot",), sources=("User",), action="never"),
            ApprovalRule(min_duration=10, max_duration=20, action="approve-after-hooks"),
        ),
        preset="vendor-sample",
    )
    user_reboot = {"EventType": "Reboot", "EventSource": "User", "DurationInSeconds": -1}
    assert decide(config, user_reboot) == decide(
        Approval(rules=config.rules[:1]), user_reboot
    )  # the explicit rule wins over the preset
    decision = decide(config, {"EventType": "Redeploy", "DurationInSeconds": 20})
    assert decision is not None
    assert (decision.action, decision.rule) == ("approve-after-hooks", "approval.rules[1]")
    assert decide(config, {"EventType": "Redeploy", "DurationInSeconds": -1}) is None
    assert decide(Approval(), user_reboot) is None  # default: never
    assert VENDOR_SAMPLE[1].max_duration == 8  # "shorter than 9 s", DurationInSeconds is whole


def test_leader_is_the_first_resource_in_sorted_order() -> None:
    group = ["WestNO_1", "westno_0", "WestNO_2"]
    leaders = [name for name in group if is_leader(Approval(), name, group)]
    assert leaders == ["westno_0"]
    assert all(is_leader(Approval(leader="self"), name, group) for name in group)
    assert not any(is_leader(Approval(leader="none"), name, group) for name in group)


def _has_started(sink: CheckedSink) -> Callable[[], bool]:
    return lambda: ("reboot", "started") in sink.summary()


async def test_in_a_three_vm_group_only_the_leader_approves(
    azure_sim: Simulator, tmp_path: Path
) -> None:
    names = ["vm-c", "vm-a", "vm-b"]
    async with running_group(azure_sim, tmp_path, names, PRESET) as (_group, runs):
        await asyncio.sleep(0.5)  # every bridge knows its identity and polls
        event_id = azure_sim.azure.add_event(
            event_type="Reboot", source="User", resources=["vm-b", "vm-c", "vm-a"]
        )
        (approved,) = await runs["vm-a"].sink.wait_for_type(APPROVED)
        for name in names:  # the leader's approval started it for the whole group
            await eventually(_has_started(runs[name].sink))
        await asyncio.sleep(0.5)
    assert [(a.event_id, a.client) for a in azure_sim.azure.approval_log] == [(event_id, "vm-a")]
    assert approved["data"]["approved_by"] == "vm-a"
    assert approved["data"]["leader"] == "sorted-first"
    assert approved["source"].endswith("/virtualMachines/vm-a")
    for name in ("vm-b", "vm-c"):
        assert runs[name].sink.of_type(APPROVED) == []
        # (a follower may poll only after the leader's approval started the event)
        assert runs[name].sink.summary()[-1] == ("reboot", "started")


def _slow_hook(seconds: float, exit_code: int = 0) -> dict[str, Any]:
    code = f"import sys, time; time.sleep({seconds}); sys.exit({exit_code})"
    return {"name": "checkpoint", "command": [sys.executable, "-c", code], "timeout": 30}


def _after_hooks(hook: dict[str, Any]) -> dict[str, Any]:
    rule = {"event_types": ["Reboot"], "action": "approve-after-hooks"}
    return {"hooks": [hook], "approval": {"rules": [rule]}}


async def test_approve_after_hooks_waits_for_a_slow_hook(
    azure_sim: Simulator, tmp_path: Path
) -> None:
    settings = _after_hooks(_slow_hook(1.5))
    async with running_bridge(azure_sim, tmp_path, AZURE, settings=settings) as run:
        event_id = azure_sim.azure.add_event(event_type="Reboot")
        await run.wait_for(1)
        await asyncio.sleep(1.0)
        assert azure_sim.azure.approvals == []  # the hook is still checkpointing
        await run.sink.wait_for_type(APPROVED)
    assert azure_sim.azure.approvals == [event_id]
    types = [e["type"] for e in run.sink.dicts()]
    assert types.index(HOOK_COMPLETED) < types.index(APPROVED)


async def test_approve_after_hooks_never_approves_after_a_failed_hook(
    azure_sim: Simulator, tmp_path: Path
) -> None:
    settings = _after_hooks(_slow_hook(0.2, exit_code=1))
    async with running_bridge(azure_sim, tmp_path, AZURE, settings=settings) as run:
        azure_sim.azure.add_event(event_type="Reboot")
        (completed,) = await run.sink.wait_for_type(HOOK_COMPLETED)
        await run.settle(1.0)
    assert completed["data"]["outcome"] == "failed"
    assert azure_sim.azure.approvals == []
    assert run.sink.of_type(APPROVED) == []


async def test_restart_during_the_hook_neither_reruns_it_nor_approves(
    azure_sim: Simulator, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    code = f"import time; open({str(runs)!r}, 'a').write('run\\n'); time.sleep(60)"
    hook = {"name": "checkpoint", "command": [sys.executable, "-c", code], "timeout": 120}
    settings = _after_hooks(hook)
    async with running_bridge(azure_sim, tmp_path, AZURE, settings=settings) as run:
        azure_sim.azure.add_event(event_type="Reboot")
        await eventually(runs.exists)
    (interrupted,) = run.sink.of_type(HOOK_COMPLETED)
    assert interrupted["data"]["outcome"] == "interrupted"
    async with running_bridge(
        azure_sim, tmp_path, AZURE, sink=CheckedSink("m"), settings=settings
    ) as run:
        assert await run.settle(1.5) == []
    assert runs.read_text() == "run\n"
    assert azure_sim.azure.approvals == []


async def test_an_approval_is_never_sent_twice_across_restarts(
    azure_sim: Simulator, tmp_path: Path
) -> None:
    async with running_bridge(azure_sim, tmp_path, AZURE, settings=PRESET) as run:
        event_id = azure_sim.azure.add_event(event_type="Reboot", source="User")
        await run.sink.wait_for_type(APPROVED)
        azure_sim.azure.find(event_id).status = "Scheduled"
        azure_sim.azure._changed()  # as if the platform had not started it yet
        await run.settle(1.0)
    async with running_bridge(
        azure_sim, tmp_path, AZURE, sink=CheckedSink("m"), settings=PRESET
    ) as run:
        await run.settle(1.0)
    assert azure_sim.azure.approvals == [event_id]
    assert run.sink.of_type(APPROVED) == []


async def test_a_refused_approval_is_not_retried(
    azure_sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The simulator answers 400 to an approval of an event it no longer knows; to hit that
    # window deterministically its state forgets every event when asked to approve one.
    monkeypatch.setattr(azure_sim.azure, "approve", lambda ids, client, user_agent: False)
    async with running_bridge(azure_sim, tmp_path, AZURE, settings=PRESET) as run:
        event_id = azure_sim.azure.add_event(event_type="Reboot", source="User")
        await run.wait_for(1)
        await run.settle(1.0)
    posts = [r for r in azure_sim.requests if r.method == "POST"]
    assert [r.status for r in posts] == [400]
    assert run.sink.of_type(APPROVED) == []
    assert event_id not in azure_sim.azure.approvals
