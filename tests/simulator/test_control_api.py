"""The ``/_sim/`` control API mirrors the Python API."""

from __future__ import annotations

import asyncio

import httpx

from bridge.simulator import Simulator

from .conftest import API, AZURE, GOOGLE


async def test_state(sim: Simulator, client: httpx.AsyncClient) -> None:
    state = (await client.get(sim.base_url + "/_sim/state")).json()
    assert state["provider"] == "both"
    assert state["gce"]["values"]["instance/maintenance-event"] == "NONE"
    assert state["azure"]["incarnation"] == 1
    assert state["identity"]["azure"]["name"] == "sim-vm-1"
    assert state["gce_url"] == sim.gce_url


async def test_gce_set_wakes_long_poll(sim: Simulator, client: httpx.AsyncClient) -> None:
    poll = asyncio.create_task(
        client.get(
            sim.gce_url + "instance/maintenance-event",
            headers=GOOGLE,
            params={"wait_for_change": "true"},
        )
    )
    await asyncio.sleep(0.2)
    r = await client.post(
        sim.base_url + "/_sim/gce/set",
        json={"key": "instance/maintenance-event", "value": "MIGRATE_ON_HOST_MAINTENANCE"},
    )
    assert r.status_code == 200
    assert (await asyncio.wait_for(poll, 1)).text == "MIGRATE_ON_HOST_MAINTENANCE"


async def test_gce_upcoming(sim: Simulator, client: httpx.AsyncClient) -> None:
    await client.post(sim.base_url + "/_sim/gce/upcoming", json={"maintenanceStatus": "PENDING"})
    assert sim.gce.upcoming is not None
    await client.post(sim.base_url + "/_sim/gce/upcoming", content=b"null")
    assert sim.gce.upcoming is None
    r = await client.post(sim.base_url + "/_sim/quirks", json={"gce": {"upcoming_none": "404"}})
    assert r.json()["gce"]["upcoming_none"] == "404"


async def test_azure_event_lifecycle(sim: Simulator, client: httpx.AsyncClient) -> None:
    base = sim.base_url + "/_sim/azure/events"
    r = await client.post(base, json={"event_type": "Reboot", "not_before_in": 60})
    assert r.status_code == 201
    event_id = r.json()["EventId"]
    assert (await client.post(f"{base}/{event_id}/start")).json()["DocumentIncarnation"] == 3
    doc = (await client.get(sim.azure_url + "scheduledevents", headers=AZURE, params=API)).json()
    assert doc["Events"][0]["EventStatus"] == "Started"
    assert (await client.delete(f"{base}/{event_id}")).status_code == 200
    assert sim.azure.events == []
    assert (await client.delete(f"{base}/{event_id}")).status_code == 404
    assert (await client.post(base, json={"event_type": "Nap"})).status_code == 400


async def test_clock_advance(sim: Simulator, client: httpx.AsyncClient) -> None:
    sim.azure.add_event(not_before_in=600)
    r = await client.post(sim.base_url + "/_sim/clock/advance", json={"seconds": 600})
    assert r.json()["sim_time"] >= 600
    assert sim.azure.events[0]["EventStatus"] == "Started"


async def test_request_log_since(sim: Simulator, client: httpx.AsyncClient) -> None:
    for _ in range(3):
        await client.get(sim.gce_url + "instance/id", headers=GOOGLE)
    log = (await client.get(sim.base_url + "/_sim/requests")).json()
    assert [r["path"] for r in log] == ["/computeMetadata/v1/instance/id"] * 3
    assert log[0]["headers"]["Metadata-Flavor"] == "Google"
    assert log[0]["status"] == 200
    later = (await client.get(sim.base_url + "/_sim/requests", params={"since": 2})).json()
    assert [r["seq"] for r in later] == [3]


async def test_scenario_load(sim: Simulator, client: httpx.AsyncClient) -> None:
    r = await client.post(sim.base_url + "/_sim/scenario", json={"name": "azure-freeze"})
    assert r.status_code == 200
    assert r.json()["scenario"] == "azure-freeze"
    assert r.json()["identity"]["azure"]["name"] == "WestNO_0"
    assert (await client.post(sim.base_url + "/_sim/clock/advance", json={"seconds": 5})).is_success
    assert sim.azure.incarnation == 2
    r = await client.post(sim.base_url + "/_sim/scenario", json={"name": "no-such"})
    assert r.status_code == 400
    names = [s["name"] for s in (await client.get(sim.base_url + "/_sim/scenarios")).json()]
    assert "gce-live-migration" in names


async def test_bad_requests(sim: Simulator, client: httpx.AsyncClient) -> None:
    assert (await client.post(sim.base_url + "/_sim/gce/set", content=b"{")).status_code == 400
    assert (await client.post(sim.base_url + "/_sim/gce/set", json={"key": "x"})).status_code == 400
    assert (await client.get(sim.base_url + "/_sim/nothing")).status_code == 404


async def test_control_api_not_logged_and_not_faulted(
    sim: Simulator, client: httpx.AsyncClient
) -> None:
    sim.faults.set(provider="all", status_burst=(503, 5))
    assert (await client.get(sim.base_url + "/_sim/state")).status_code == 200
    assert sim.requests == []
