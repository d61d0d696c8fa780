"""Azure IMDS Scheduled Events rules (metadata-services.md, the vendor page), pinned with
plain HTTP requests."""

from __future__ import annotations

import asyncio
import re
import time
from email.utils import parsedate_to_datetime

import httpx
import pytest

from bridge.simulator import Simulator

from .conftest import API, AZURE

VERSIONS = ["2020-07-01", "2019-08-01", "2019-04-01", "2019-01-01", "2017-11-01", "2017-08-01"]


async def events(
    client: httpx.AsyncClient, sim: Simulator, version: str = "2020-07-01"
) -> httpx.Response:
    return await client.get(
        sim.azure_url + "scheduledevents", headers=AZURE, params={"api-version": version}
    )


async def approve(client: httpx.AsyncClient, sim: Simulator, body: bytes) -> httpx.Response:
    return await client.post(
        sim.azure_url + "scheduledevents", headers=AZURE, params=API, content=body
    )


@pytest.mark.parametrize("version", VERSIONS)
async def test_documented_api_versions_accepted(
    sim: Simulator, client: httpx.AsyncClient, version: str
) -> None:
    r = await events(client, sim, version)
    assert r.status_code == 200
    assert r.json() == {"DocumentIncarnation": 1, "Events": []}


@pytest.mark.parametrize("params", [{}, {"api-version": "2099-01-01"}, {"api-version": "latest"}])
async def test_missing_or_unknown_api_version_400(
    sim: Simulator, client: httpx.AsyncClient, params: dict[str, str]
) -> None:
    r = await client.get(sim.azure_url + "scheduledevents", headers=AZURE, params=params)
    assert r.status_code == 400
    assert "api-version" in r.json()["error"]


@pytest.mark.parametrize("headers", [{}, {"Metadata": "false"}])
async def test_metadata_header_required(
    sim: Simulator, client: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    r = await client.get(sim.azure_url + "scheduledevents", headers=headers, params=API)
    assert r.status_code == 400
    assert r.json() == {"error": "Bad request: . Required metadata header not specified"}


async def test_metadata_header_value_case_insensitive(
    sim: Simulator, client: httpx.AsyncClient
) -> None:
    r = await client.get(
        sim.azure_url + "scheduledevents", headers={"Metadata": "True"}, params=API
    )
    assert r.status_code == 200


async def test_x_forwarded_for_rejected(sim: Simulator, client: httpx.AsyncClient) -> None:
    r = await client.get(
        sim.azure_url + "scheduledevents",
        headers=AZURE | {"X-Forwarded-For": "10.0.0.1"},
        params=API,
    )
    assert r.status_code == 400
    assert "X-Forwarded-For" in r.json()["error"]


async def test_document_fields_order_and_formats(sim: Simulator, client: httpx.AsyncClient) -> None:
    event_id = sim.azure.add_event(event_type="Reboot", not_before_in=900)
    r = await events(client, sim)
    assert r.headers["content-type"].startswith("application/json")
    doc = r.json()
    assert list(doc) == ["DocumentIncarnation", "Events"]
    (event,) = doc["Events"]
    assert list(event) == [
        "EventId",
        "EventStatus",
        "EventType",
        "ResourceType",
        "Resources",
        "NotBefore",
        "Description",
        "EventSource",
        "DurationInSeconds",
    ]
    assert event["EventId"] == event_id
    assert re.fullmatch(r"[0-9A-F]{8}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{12}", event_id)
    assert event["ResourceType"] == "VirtualMachine"
    assert event["Resources"] == ["sim-vm-1"]
    assert event["EventSource"] == "Platform"
    assert event["DurationInSeconds"] == -1
    assert re.fullmatch(r"[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT",
                        event["NotBefore"])  # fmt: skip
    # at speed 1, NotBefore is 900 s of wall-clock time ahead
    ahead = parsedate_to_datetime(event["NotBefore"]).timestamp() - time.time()
    assert 895 <= ahead <= 901


async def test_not_before_follows_speed(client: httpx.AsyncClient) -> None:
    async with Simulator(provider="azure", speed=60) as s:
        s.azure.add_event(event_type="Freeze", not_before_in=900)
        event = (await events(client, s)).json()["Events"][0]
        ahead = parsedate_to_datetime(event["NotBefore"]).timestamp() - time.time()
        assert 13 <= ahead <= 16  # 15 sim minutes at 60x are 15 real seconds


@pytest.mark.parametrize(
    ("version", "present"),
    [
        ("2020-07-01", {"Description", "EventSource", "DurationInSeconds"}),
        ("2019-08-01", {"Description", "EventSource"}),
        ("2019-04-01", {"Description"}),
        ("2019-01-01", set()),
        ("2017-08-01", set()),
    ],
)
async def test_older_versions_omit_later_fields(
    sim: Simulator, client: httpx.AsyncClient, version: str, present: set[str]
) -> None:
    sim.azure.add_event()
    event = (await events(client, sim, version)).json()["Events"][0]
    assert {"Description", "EventSource", "DurationInSeconds"} & set(event) == present


async def test_incarnation_moves_on_every_change_and_only_then(
    sim: Simulator, client: httpx.AsyncClient
) -> None:
    async def inc() -> int:
        return int((await events(client, sim)).json()["DocumentIncarnation"])

    assert [await inc(), await inc()] == [1, 1]
    event_id = sim.azure.add_event()
    assert await inc() == 2
    assert await inc() == 2
    sim.azure.start_event(event_id)
    assert await inc() == 3
    sim.azure.start_event(event_id)  # already Started: no change
    assert await inc() == 3
    sim.azure.remove_event(event_id)
    assert await inc() == 4
    assert (await events(client, sim)).json()["Events"] == []


async def test_started_event_has_empty_not_before(
    sim: Simulator, client: httpx.AsyncClient
) -> None:
    sim.azure.add_event(event_type="Reboot", status="Started")
    event = (await events(client, sim)).json()["Events"][0]
    assert (event["EventStatus"], event["NotBefore"]) == ("Started", "")


async def test_auto_start_at_not_before_and_removal_after_duration(
    sim: Simulator, client: httpx.AsyncClient
) -> None:
    sim.azure.add_event(event_type="Freeze", not_before_in=900, duration=7)
    sim.clock.advance(899)
    assert sim.azure.events[0]["EventStatus"] == "Scheduled"
    sim.clock.advance(1)
    doc = (await events(client, sim)).json()
    assert (doc["DocumentIncarnation"], doc["Events"][0]["EventStatus"]) == (3, "Started")
    sim.clock.advance(6.9)
    assert len(sim.azure.events) == 1
    sim.clock.advance(0.1)  # DurationInSeconds 7 is over
    assert (await events(client, sim)).json() == {"DocumentIncarnation": 4, "Events": []}


async def test_default_started_lifetime_for_unknown_duration(sim: Simulator) -> None:
    sim.azure.add_event(status="Started", duration=-1)
    sim.clock.advance(299)
    assert sim.azure.events
    sim.clock.advance(1)
    assert sim.azure.events == []


async def test_auto_transitions_happen_in_real_time(client: httpx.AsyncClient) -> None:
    async with Simulator(provider="azure", speed=1000) as s:
        s.faults.set("azure", rate_limit=False)
        s.azure.add_event(not_before_in=100, started_for=100)  # 0.1 s real each
        await asyncio.sleep(0.15)
        assert s.azure.events[0]["EventStatus"] == "Started"
        await asyncio.sleep(0.15)
        assert s.azure.events == []


async def test_post_start_request(sim: Simulator, client: httpx.AsyncClient) -> None:
    event_id = sim.azure.add_event(event_type="Reboot", source="User")
    body = b'{"StartRequests": [{"EventId": "%s"}]}' % event_id.encode()
    r = await approve(client, sim, body)
    assert r.status_code == 200
    doc = (await events(client, sim)).json()
    assert doc["DocumentIncarnation"] == 3
    assert doc["Events"][0]["EventStatus"] == "Started"
    assert doc["Events"][0]["NotBefore"] == ""
    # approving again (e.g. another VM of the set) is still 200 and changes nothing
    assert (await approve(client, sim, body)).status_code == 200
    assert (await events(client, sim)).json()["DocumentIncarnation"] == 3
    assert sim.azure.approvals == [event_id, event_id]
    assert sim.azure.approval_log[0].client == "127.0.0.1"


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[]",
        b"{}",
        b'{"StartRequests": {}}',
        b'{"StartRequests": []}',
        b'{"StartRequests": [{"Id": "x"}]}',
        b'{"StartRequests": [{"EventId": 5}]}',
    ],
)
async def test_post_malformed_body_400(
    sim: Simulator, client: httpx.AsyncClient, body: bytes
) -> None:
    sim.azure.add_event()
    r = await approve(client, sim, body)
    assert r.status_code == 400
    assert sim.azure.incarnation == 2


async def test_post_unknown_event_id(sim: Simulator, client: httpx.AsyncClient) -> None:
    body = b'{"StartRequests": [{"EventId": "00000000-0000-0000-0000-000000000000"}]}'
    assert (await approve(client, sim, body)).status_code == 400
    sim.azure.quirks.unknown_approval_status = 404
    assert (await approve(client, sim, body)).status_code == 404
    assert sim.azure.approvals == []


async def test_post_needs_metadata_header(sim: Simulator, client: httpx.AsyncClient) -> None:
    r = await client.post(sim.azure_url + "scheduledevents", params=API, content=b"{}")
    assert r.status_code == 400


async def test_rate_limit_5_per_second(sim: Simulator, client: httpx.AsyncClient) -> None:
    sim.faults.set("azure", rate_limit=True)
    statuses = [(await events(client, sim)).status_code for _ in range(7)]
    assert statuses[:5] == [200] * 5
    assert statuses[5:] == [429, 429]
    await asyncio.sleep(1.05)
    assert (await events(client, sim)).status_code == 200


async def test_rate_limit_on_by_default_and_switchable(client: httpx.AsyncClient) -> None:
    async with Simulator(provider="azure") as s:
        assert s.faults.azure.rate_limit
        s.faults.set("azure", rate_limit=False)
        statuses = {(await events(client, s)).status_code for _ in range(10)}
        assert statuses == {200}


async def test_instance_metadata(sim: Simulator, client: httpx.AsyncClient) -> None:
    r = await client.get(
        sim.azure_url + "instance", headers=AZURE, params={"api-version": "2021-02-01"}
    )
    compute = r.json()["compute"]
    ident = sim.identity.azure
    assert compute["name"] == "sim-vm-1"
    assert compute["vmId"] == ident.vm_id
    assert compute["resourceId"] == (
        f"/subscriptions/{ident.subscription_id}/resourceGroups/sim-rg"
        "/providers/Microsoft.Compute/virtualMachines/sim-vm-1"
    )
    assert (compute["location"], compute["zone"], compute["vmScaleSetName"]) == (
        "westeurope",
        "1",
        "",
    )
    assert compute["resourceGroupName"] == "sim-rg"
    assert compute["subscriptionId"] == ident.subscription_id
    r = await client.get(
        sim.azure_url + "instance/compute/name",
        headers=AZURE,
        params={"api-version": "2021-02-01", "format": "text"},
    )
    assert (r.status_code, r.text) == (200, "sim-vm-1")
    assert r.headers["content-type"].startswith("text/plain")
    r = await client.get(sim.azure_url + "instance", params={"api-version": "2021-02-01"})
    assert r.status_code == 400
    r = await client.get(sim.azure_url + "instance", headers=AZURE)
    assert r.status_code == 400


async def test_first_call_delay_quirk(sim: Simulator, client: httpx.AsyncClient) -> None:
    sim.azure.quirks.first_call_delay = 0.3
    started = time.monotonic()
    await events(client, sim)
    assert time.monotonic() - started >= 0.3
    started = time.monotonic()
    await events(client, sim)
    assert time.monotonic() - started < 0.2


async def test_hardware_failure_appears_directly_started(
    sim: Simulator, client: httpx.AsyncClient
) -> None:
    sim.load("azure-hardware-failure")
    sim.faults.set("azure", rate_limit=False)
    sim.clock.advance(5)
    (event,) = (await events(client, sim)).json()["Events"]
    assert (event["EventType"], event["EventStatus"], event["NotBefore"]) == (
        "Reboot",
        "Started",
        "",
    )


async def test_other_vm_event_does_not_name_this_vm(
    sim: Simulator, client: httpx.AsyncClient
) -> None:
    sim.load("azure-other-vm")
    sim.faults.set("azure", rate_limit=False)
    sim.clock.advance(5)
    (event,) = (await events(client, sim)).json()["Events"]
    assert sim.identity.azure.name not in event["Resources"]
