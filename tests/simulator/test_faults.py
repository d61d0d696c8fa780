"""Faults, switchable live from Python and over the control API."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from bridge.simulator import Simulator

from .conftest import API, AZURE, GOOGLE

MAINT = "instance/maintenance-event"


async def gce(client: httpx.AsyncClient, sim: Simulator) -> httpx.Response:
    return await client.get(sim.gce_url + MAINT, headers=GOOGLE)


async def azure(client: httpx.AsyncClient, sim: Simulator) -> httpx.Response:
    return await client.get(sim.azure_url + "scheduledevents", headers=AZURE, params=API)


async def test_status_burst_then_recovery(sim: Simulator, client: httpx.AsyncClient) -> None:
    sim.faults.set(provider="gce", status_burst=(503, 2))
    first, second, third = [await gce(client, sim) for _ in range(3)]
    assert [first.status_code, second.status_code, third.status_code] == [503, 503, 200]
    assert first.headers["Metadata-Flavor"] == "Google"  # like every GCE response
    assert (await azure(client, sim)).status_code == 200  # other provider untouched


async def test_status_burst_all_providers(sim: Simulator, client: httpx.AsyncClient) -> None:
    sim.faults.set(provider="all", status_burst=(500, 1))
    assert (await gce(client, sim)).status_code == 500
    r = await azure(client, sim)
    assert r.status_code == 500
    assert "error" in r.json()


async def test_latency(sim: Simulator, client: httpx.AsyncClient) -> None:
    sim.faults.set(provider="gce", latency=0.3)
    started = time.monotonic()
    assert (await gce(client, sim)).status_code == 200
    assert time.monotonic() - started >= 0.3


async def test_drop_closes_without_response(sim: Simulator, client: httpx.AsyncClient) -> None:
    sim.faults.set(provider="azure", drop=1)
    with pytest.raises(httpx.RemoteProtocolError):
        await azure(client, sim)
    assert (await azure(client, sim)).status_code == 200
    assert sim.requests[0].status == 0
    assert sim.requests[0].fault == "drop"


async def test_malformed_bodies(sim: Simulator, client: httpx.AsyncClient) -> None:
    sim.faults.set(provider="all", malformed=1)
    r = await azure(client, sim)
    assert r.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.text)
    r = await gce(client, sim)
    assert r.content not in (b"NONE", b"")
    assert (await gce(client, sim)).text == "NONE"


async def test_hang_until_cleared(sim: Simulator, client: httpx.AsyncClient) -> None:
    sim.faults.set(provider="gce", hang=True)
    task = asyncio.create_task(gce(client, sim))
    await asyncio.sleep(0.3)
    assert not task.done()
    assert sim.requests[-1].status is None  # logged while in flight
    sim.faults.clear()
    assert (await asyncio.wait_for(task, 1)).status_code == 200


async def test_hang_released_by_stop(client: httpx.AsyncClient) -> None:
    s = Simulator(provider="gce")
    await s.start()
    s.faults.set(hang=True)
    task = asyncio.create_task(gce(client, s))
    await asyncio.sleep(0.2)
    await s.stop()
    with pytest.raises(httpx.HTTPError):
        await asyncio.wait_for(task, 2)


async def test_missing_vendor_header(sim: Simulator, client: httpx.AsyncClient) -> None:
    sim.faults.set(provider="gce", missing_vendor_header=1)
    r = await gce(client, sim)
    assert r.status_code == 200
    assert "Metadata-Flavor" not in r.headers
    assert (await gce(client, sim)).headers["Metadata-Flavor"] == "Google"


async def test_redirect_is_not_to_be_followed(sim: Simulator, client: httpx.AsyncClient) -> None:
    sim.faults.set(provider="all", redirect=1)
    r = await gce(client, sim)
    assert r.status_code == 302
    assert r.headers["location"].endswith("/_sim/redirect-target")
    assert sim.redirects_followed == 0
    async with httpx.AsyncClient(follow_redirects=True) as naive:
        await azure(naive, sim)
    assert sim.redirects_followed == 1  # a client that follows is detectable


async def test_unknown_fault_rejected(sim: Simulator) -> None:
    with pytest.raises(ValueError, match="unknown faults"):
        sim.faults.set(provider="gce", explode=True)


async def test_faults_over_control_api(sim: Simulator, client: httpx.AsyncClient) -> None:
    r = await client.post(
        sim.base_url + "/_sim/faults", json={"provider": "gce", "status_burst": [503, 1]}
    )
    assert r.status_code == 200
    assert r.json()["gce"]["status_burst"] == [503, 1]
    assert (await gce(client, sim)).status_code == 503
    await client.post(sim.base_url + "/_sim/faults", json={"provider": "gce", "latency": 5})
    r = await client.delete(sim.base_url + "/_sim/faults")
    assert r.json()["gce"]["latency"] == 0.0
    assert r.json()["azure"]["rate_limit"] is True  # the documented default is back
    assert (await gce(client, sim)).status_code == 200
