"""The status API, served by the bridge's own listener in front of a running bridge."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from bridge import contract
from bridge.config import Listener as ListenerSettings
from bridge.contract import from_cloudevent
from bridge.eligibility import eligibility
from bridge.pipeline.events import serialize, to_cloudevent
from bridge.pipeline.model import Kind, Notice, Status
from bridge.pipeline.typed_events import maintenance
from bridge.runner import Bridge, ProviderName
from bridge.simulator import Simulator
from bridge.surface.health import HealthMonitor
from bridge.surface.routes import serving
from tests.factories import GCE_VM
from tests.support import CheckedSink, eventually, running_bridge

AZURE: tuple[ProviderName, ...] = ("azure",)
MIGRATE = "MIGRATE_ON_HOST_MAINTENANCE"


@contextlib.asynccontextmanager
async def status_client(bridge: Bridge | None) -> AsyncIterator[httpx.AsyncClient]:
    monitor = HealthMonitor()
    if bridge is not None:
        monitor.attach(bridge)
    async with serving(ListenerSettings(port=0), monitor) as listener:
        assert listener is not None
        async with httpx.AsyncClient(base_url=listener.url) as client:
            yield client


async def get(client: httpx.AsyncClient, path: str) -> tuple[int, Any]:
    response = await client.get(path)
    return response.status_code, response.json()


async def test_eligible_flips_to_503_when_a_notice_arrives_and_back_after_completion(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    async with running_bridge(gce_sim, tmp_path) as run, status_client(run.bridge) as client:
        assert await get(client, "/v1/notices") == (200, [])
        status, body = await get(client, "/v1/eligible")
        assert (status, body["eligible"], body["reason"]) == (200, True, "no maintenance in force")

        gce_sim.gce.set("instance/maintenance-event", MIGRATE)
        (started,) = await run.wait_for(1)
        status, body = await get(client, "/v1/eligible")
        assert status == 503
        assert body["eligible"] is False
        (blocking,) = body["blocking"]
        assert (blocking["kind"], blocking["status"], blocking["reason"]) == (
            "live-migrate",
            "started",
            "started",
        )
        assert blocking["notice_id"] == started["data"]["notice_id"]
        assert "live-migrate started" in body["reason"]
        response = await client.get("/v1/notices")
        assert response.headers["content-type"] == "application/cloudevents-batch+json"
        assert response.json() == [started]

        gce_sim.gce.set("instance/maintenance-event", "NONE")
        await run.wait_for(2)
        assert (await get(client, "/v1/eligible"))[0] == 200
        assert await get(client, "/v1/notices") == (200, [])


async def test_a_notice_beyond_the_horizon_is_eligible_but_announced(
    azure_sim: Simulator, tmp_path: Path
) -> None:
    settings = {"status": {"eligible_horizon": 300}}
    async with (
        running_bridge(azure_sim, tmp_path, AZURE, settings=settings) as run,
        status_client(run.bridge) as client,
    ):
        far = azure_sim.azure.add_event(event_type="Redeploy", not_before_in=900)
        await run.wait_for(1)
        status, body = await get(client, "/v1/eligible")
        assert (status, body["blocking"]) == (200, [])
        assert body["reason"] == "maintenance scheduled, but beyond the horizon"
        (upcoming,) = body["upcoming"]
        assert upcoming["notice_id"] == far
        assert 880 < upcoming["seconds_until"] <= 900

        near = azure_sim.azure.add_event(event_type="Freeze", not_before_in=120)
        await run.wait_for(2)
        status, body = await get(client, "/v1/eligible")
        assert status == 503
        assert [b["notice_id"] for b in body["blocking"]] == [near]
        assert [u["notice_id"] for u in body["upcoming"]] == [far]


async def test_gce_preemption_is_not_eligible(gce_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(gce_sim, tmp_path) as run, status_client(run.bridge) as client:
        gce_sim.gce.set("instance/preempted", "TRUE")
        await run.wait_for(1)
        status, body = await get(client, "/v1/eligible")
    assert status == 503
    assert body["blocking"][0]["kind"] == "preempt"


async def test_a_restart_remembers_the_notices_in_force(gce_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(gce_sim, tmp_path) as run:
        gce_sim.gce.set("instance/maintenance-event", MIGRATE)
        (started,) = await run.wait_for(1)
    async with (
        running_bridge(gce_sim, tmp_path, sink=CheckedSink("m")) as run,
        status_client(run.bridge) as client,
    ):
        await eventually(lambda: len(run.bridge.in_force))
        assert await get(client, "/v1/notices") == (200, [started])
        assert (await get(client, "/v1/eligible"))[0] == 503


def test_scheduled_with_no_known_time_blocks() -> None:
    now = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
    notice = Notice(GCE_VM, Kind.TERMINATE, Status.SCHEDULED, "n1", observed_at=now)
    event = from_cloudevent(serialize(to_cloudevent(notice)))
    ok, body = eligibility([event], now, 3600)
    assert not ok
    assert body["blocking"][0]["reason"] == "scheduled, time unknown"  # type: ignore[index]

    def starting_at(not_before: datetime) -> contract.Event:
        typed = from_cloudevent(serialize(to_cloudevent(replace(notice, not_before=not_before))))
        assert maintenance(typed).not_before == not_before
        return typed

    assert not eligibility([starting_at(now + timedelta(seconds=3599))], now, 3600)[0]
    assert eligibility([starting_at(now + timedelta(hours=2))], now, 3600)[0]


async def test_the_horizon_can_be_asked_per_request(azure_sim: Simulator, tmp_path: Path) -> None:
    async with (
        running_bridge(azure_sim, tmp_path, AZURE) as run,
        status_client(run.bridge) as client,
    ):
        azure_sim.azure.add_event(event_type="Redeploy", not_before_in=900)
        await run.wait_for(1)
        assert (await get(client, "/v1/eligible"))[0] == 503  # default horizon: one hour
        assert (await get(client, "/v1/eligible?horizon=600"))[0] == 200
        status, body = await get(client, "/v1/eligible?horizon=soon")
    assert (status, body) == (400, {"error": "horizon must be a number of seconds >= 0"})


async def test_while_starting_nothing_is_vouched_for() -> None:
    async with status_client(None) as client:
        status, body = await get(client, "/v1/eligible")
        notices_status, _ = await get(client, "/v1/notices")
    assert (status, body["eligible"], notices_status) == (503, False, 503)
    assert "not watching yet" in body["reason"]
