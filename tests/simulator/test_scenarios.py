"""Shipped scenarios, the file format, and the timeline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bridge.simulator import ScenarioError, Simulator, list_scenarios, load_scenario

SHIPPED = {
    "gce-live-migration",
    "gce-gpu-terminate",
    "gce-spot-preemption",
    "gce-upcoming-maintenance",
    "gce-upcoming-cancelled",
    "azure-freeze",
    "azure-user-reboot",
    "azure-platform-redeploy",
    "azure-spot-preempt",
    "azure-scale-in-terminate",
    "azure-cancelled",
    "azure-other-vm",
    "azure-hardware-failure",
    "demo",
    "aws-spot-terminate",
    "aws-spot-stop",
    "aws-spot-hibernate",
    "aws-rebalance-then-interruption",
    "aws-scheduled-reboot",
    "aws-scheduled-cancelled",
    "aws-asg-scale-in",
}
GUID = re.compile(r"[0-9A-F]{8}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{12}")


def test_list_scenarios() -> None:
    listed = dict(list_scenarios())
    assert set(listed) >= SHIPPED
    assert all(listed.values())


@pytest.mark.parametrize("name", sorted(SHIPPED))
async def test_every_scenario_plays_to_the_end(name: str) -> None:
    scenario = load_scenario(name)
    for step in scenario.steps:
        if "event_id" in step.params:
            assert GUID.fullmatch(step.params["event_id"]) or step.action.startswith("aws.")
    async with Simulator(provider="all", scenario=name) as sim:
        sim.gce.mark_watched()
        sim.clock.advance(scenario.duration + 3600)
        assert sim.pending_steps == []
        assert len(sim.fired) >= len(scenario.steps)


async def _timeline(name: str, checkpoints: list[float]) -> list[object]:
    async with Simulator(provider="both", scenario=name) as sim:
        sim.gce.mark_watched()
        out: list[object] = []
        for delta in checkpoints:
            sim.clock.advance(delta)
            out.append([(e["EventType"], e["EventStatus"]) for e in sim.azure.events])
        return out


async def test_gce_gpu_terminate_60_min_notice() -> None:
    async with Simulator(provider="gce", scenario="gce-gpu-terminate") as sim:
        assert sim.gce.get("instance/scheduling/on-host-maintenance") == "TERMINATE"
        sim.clock.advance(60)
        assert sim.gce.get("instance/maintenance-event") == "TERMINATE_ON_HOST_MAINTENANCE"
        sim.clock.advance(3599)
        assert sim.gce.get("instance/maintenance-event") == "TERMINATE_ON_HOST_MAINTENANCE"


async def test_gce_spot_preemption() -> None:
    async with Simulator(provider="gce", scenario="gce-spot-preemption") as sim:
        assert sim.gce.get("instance/scheduling/provisioning-model") == "SPOT"
        sim.clock.advance(29)
        assert sim.gce.get("instance/preempted") == "FALSE"
        sim.clock.advance(1)
        assert sim.gce.get("instance/preempted") == "TRUE"


async def test_azure_timelines() -> None:
    assert await _timeline("azure-user-reboot", [5, 900, 120]) == [
        [("Reboot", "Scheduled")],
        [("Reboot", "Started")],
        [],
    ]
    assert await _timeline("azure-platform-redeploy", [5, 599, 1]) == [
        [("Redeploy", "Scheduled")],
        [("Redeploy", "Scheduled")],
        [("Redeploy", "Started")],
    ]
    assert await _timeline("azure-spot-preempt", [5, 30]) == [
        [("Preempt", "Scheduled")],
        [("Preempt", "Started")],
    ]
    assert await _timeline("azure-scale-in-terminate", [5, 600]) == [
        [("Terminate", "Scheduled")],
        [("Terminate", "Started")],
    ]
    assert await _timeline("azure-cancelled", [5, 295]) == [[("Reboot", "Scheduled")], []]
    assert await _timeline("azure-hardware-failure", [5]) == [[("Reboot", "Started")]]


async def test_scenario_step_firing_late_uses_its_own_time() -> None:
    # one big jump: the event is created at t=5, starts at 905 and is gone at 914
    async with Simulator(provider="azure", scenario="azure-freeze") as sim:
        sim.clock.advance(10_000)
        assert sim.azure.incarnation == 4
        assert [at for at, _ in sim.fired] == [5.0, 905.0, 914.0]


async def test_real_time_playback_under_speed() -> None:
    import asyncio

    async with Simulator(provider="gce", scenario="gce-spot-preemption", speed=300) as sim:
        await asyncio.sleep(0.25)  # 30 sim seconds take 0.1 s at 300x
        assert sim.gce.get("instance/preempted") == "TRUE"


def test_custom_scenario_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        'name = "mine"\nprovider = "azure"\ndescription = "d"\n'
        '[identity.azure]\nname = "app-0"\n'
        "[quirks.azure]\nunknown_approval_status = 404\n"
        '[[steps]]\nat = 1\naction = "azure.add"\nevent_type = "Reboot"\n'
    )
    scenario = load_scenario(str(path))
    assert scenario.name == "mine"
    assert scenario.steps[0].params == {"event_type": "Reboot"}


async def test_custom_scenario_applies_identity_and_quirks(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        'provider = "azure"\n[identity.azure]\nname = "app-0"\n'
        "[quirks.azure]\nunknown_approval_status = 404\n"
        '[[steps]]\nat = 1\naction = "azure.add"\nevent_type = "Reboot"\n'
    )
    async with Simulator(provider="azure", scenario=path) as sim:
        sim.clock.advance(1)
        assert sim.azure.events[0]["Resources"] == ["app-0"]
        assert sim.azure.quirks.unknown_approval_status == 404


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('provider = "oci"', "provider"),
        ('[[steps]]\naction = "log"', "needs 'at'"),
        ('[[steps]]\nat = 1\naction = "explode"', "unknown action"),
        ('[[steps]]\nat = 1\naction = "gce.set"\nkey = "k"', "needs"),
        ('[[steps]]\nat = 1\naction = "log"\ncolor = "red"', "does not take"),
        ("bogus = 1", "unknown top-level"),
        ("not toml [", "bad.toml"),
    ],
)
def test_invalid_scenarios(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=message):
        load_scenario(path)


def test_unknown_scenario_name() -> None:
    with pytest.raises(ScenarioError, match="unknown scenario"):
        load_scenario("no-such-scenario")


def test_provider_mismatch() -> None:
    with pytest.raises(ValueError, match="provider"):
        Simulator(provider="gce", scenario="azure-freeze")
