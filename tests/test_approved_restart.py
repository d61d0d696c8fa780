"""An Azure event we approved ran, even when the bridge was down while it ran and vanished."""

from __future__ import annotations

from pathlib import Path

from bridge.actions.audit import APPROVED
from bridge.runner import ProviderName
from bridge.simulator import Simulator
from tests.support import running_bridge

AZURE: tuple[ProviderName, ...] = ("azure",)
APPROVE_REBOOTS = {"approval": {"rules": [{"event_types": ["Reboot"], "action": "approve"}]}}


async def test_an_event_approved_early_that_vanished_while_down_is_completed(
    azure_sim: Simulator, tmp_path: Path
) -> None:
    # A slow poll: the bridge stops after approving, before it can see the event start.
    slow = {"poll_interval": 60.0}
    async with running_bridge(
        azure_sim, tmp_path, AZURE, settings=APPROVE_REBOOTS, azure=slow
    ) as run:
        event_id = azure_sim.azure.add_event(event_type="Reboot", not_before_in=900.0)
        await run.sink.wait_for_type(APPROVED)
    assert run.sink.summary() == [("reboot", "scheduled")]
    assert azure_sim.azure.approvals == [event_id]
    azure_sim.azure.remove_event(event_id)  # it started at once, ran, and is over

    async with running_bridge(azure_sim, tmp_path, AZURE, settings=APPROVE_REBOOTS) as run:
        (ended,) = await run.wait_for(1)
        assert (await run.settle()) == [ended]
    assert ended["data"]["notice_id"] == event_id
    assert ended["data"]["status"] == "completed"  # not cancelled: we approved it, so it ran
    assert ended["data"]["outcome_inferred"] is True
