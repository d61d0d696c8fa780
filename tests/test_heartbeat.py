"""Heartbeats: the running bridge announces itself through its spool and sinks."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge import contract
from bridge.config import ConfigError, parse_config
from bridge.infra.buildinfo import RELEASE, version
from bridge.simulator import Simulator
from tests.support import running_bridge

BEATING = {"heartbeat": {"interval": 0.2}}


async def test_heartbeats_come_at_start_then_every_interval_and_validate(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    async with running_bridge(gce_sim, tmp_path, settings=BEATING) as run:
        beats = await run.sink.wait_for_type(contract.HEARTBEAT, 3)
    typed = [contract.from_cloudevent(beat) for beat in beats]  # CheckedSink validated each
    assert len({beat.id for beat in typed}) == len(typed)
    first = typed[0]
    assert isinstance(first.data, contract.HeartbeatData)
    assert first.source == run.bridge.instances["gce"].source
    assert first.subject == run.bridge.instances["gce"].name
    assert (first.data.provider, first.data.agent_version) == ("gce", version())
    assert first.data.agent_version.startswith(RELEASE)  # and names the commit in a checkout
    assert first.data.interval_seconds == 0.2
    assert first.data.watcher_healthy is True
    assert first.data.spool_depth >= 0
    assert len({beat.data.started_at for beat in typed}) == 1  # type: ignore[union-attr]


async def test_heartbeats_share_the_road_with_notices(gce_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(gce_sim, tmp_path, settings=BEATING) as run:
        await run.sink.wait_for_type(contract.HEARTBEAT, 1)
        gce_sim.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
        await run.sink.wait_for_type(contract.STARTED, 1)
        await run.sink.wait_for_type(contract.HEARTBEAT, 3)
    assert run.sink.summary() == [("live-migrate", "started")]


async def test_interval_zero_sends_no_heartbeat(gce_sim: Simulator, tmp_path: Path) -> None:
    settings = {"heartbeat": {"interval": 0}}
    async with running_bridge(gce_sim, tmp_path, settings=settings) as run:
        gce_sim.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
        await run.sink.wait_for_type(contract.STARTED, 1)
        await asyncio.sleep(0.3)
    assert run.sink.of_type(contract.HEARTBEAT) == []


def test_the_default_interval_is_five_minutes_and_negative_is_refused() -> None:
    assert parse_config({}).heartbeat.interval == 300.0
    with pytest.raises(ConfigError, match=r"heartbeat.interval: must be >= 0"):
        parse_config({"heartbeat": {"interval": -1}})
