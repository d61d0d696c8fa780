"""GCE metadata server rules (metadata-services.md), pinned with plain HTTP requests."""

from __future__ import annotations

import asyncio
import calendar
import json
import re
import time

import httpx
import pytest

from bridge.simulator import Simulator

from .conftest import GOOGLE

MAINT = "instance/maintenance-event"


async def get(client: httpx.AsyncClient, sim: Simulator, key: str, **params: str) -> httpx.Response:
    return await client.get(sim.gce_url + key, headers=GOOGLE, params=params)


# -- headers ------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [{}, {"Metadata-Flavor": "google-ish"}])
async def test_metadata_flavor_required_403_html(
    sim: Simulator, client: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    r = await client.get(sim.gce_url + MAINT, headers=headers)
    assert r.status_code == 403
    assert r.headers["content-type"].startswith("text/html")
    assert "Metadata-Flavor" in r.text
    assert r.headers["Metadata-Flavor"] == "Google"


async def test_x_forwarded_for_rejected(sim: Simulator, client: httpx.AsyncClient) -> None:
    r = await client.get(sim.gce_url + MAINT, headers=GOOGLE | {"X-Forwarded-For": "10.0.0.1"})
    assert r.status_code == 403
    assert r.headers["Metadata-Flavor"] == "Google"


async def test_unknown_key_404_with_vendor_header(
    sim: Simulator, client: httpx.AsyncClient
) -> None:
    r = await get(client, sim, "instance/no-such-key")
    assert r.status_code == 404
    assert r.headers["Metadata-Flavor"] == "Google"
    r = await client.get(sim.base_url + "/elsewhere", headers=GOOGLE)
    assert r.status_code == 404
    assert r.headers["Metadata-Flavor"] == "Google"


async def test_root_answers_like_the_metadata_server(
    sim: Simulator, client: httpx.AsyncClient
) -> None:
    # google-auth detects GCE by this header on the root URL
    r = await client.get(sim.base_url + "/", headers=GOOGLE)
    assert r.status_code == 200
    assert r.headers["Metadata-Flavor"] == "Google"


# -- keys -----------------------------------------------------------------------------------


async def test_default_values_and_content_type(sim: Simulator, client: httpx.AsyncClient) -> None:
    r = await get(client, sim, MAINT)
    assert (r.status_code, r.text) == (200, "NONE")
    assert r.headers["content-type"] == "application/text"
    assert re.fullmatch(r"[0-9a-f]{16}", r.headers["etag"])
    assert (await get(client, sim, "instance/preempted")).text == "FALSE"


async def test_identity_keys(sim: Simulator, client: httpx.AsyncClient) -> None:
    ident = sim.identity.gce
    assert (await get(client, sim, "instance/id")).text == "4520031799277582256"
    assert (await get(client, sim, "instance/name")).text == "sim-vm-1"
    assert (
        await get(client, sim, "instance/zone")
    ).text == "projects/123456789012/zones/us-central1-a"
    assert (await get(client, sim, "project/project-id")).text == ident.project_id == "sim-project"
    assert (await get(client, sim, "project/numeric-project-id")).text == "123456789012"


async def test_identity_overrides() -> None:
    override = {"gce": {"instance_name": "web-7"}}
    async with Simulator(provider="gce", identity=override) as s, httpx.AsyncClient() as c:
        assert (await get(c, s, "instance/name")).text == "web-7"


async def test_scheduling_directory_listing(sim: Simulator, client: httpx.AsyncClient) -> None:
    r = await get(client, sim, "instance/scheduling/")
    assert r.headers["content-type"] == "application/text"
    assert r.text.splitlines() == [
        "automatic-restart",
        "on-host-maintenance",
        "preemptible",
        "provisioning-model",
    ]
    r = await get(client, sim, "instance/scheduling/", alt="json")
    assert r.headers["content-type"] == "application/json"
    assert "on-host-maintenance" in r.json()
    r = await get(client, sim, "instance/scheduling/", recursive="true")
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {
        "automaticRestart": "TRUE",
        "onHostMaintenance": "MIGRATE",
        "preemptible": "FALSE",
        "provisioningModel": "STANDARD",
    }
    r = await get(client, sim, "instance/", recursive="true")
    assert r.json()["maintenanceEvent"] == "NONE"
    assert r.json()["id"] == 4520031799277582256
    assert "scheduling/" in (await get(client, sim, "instance/")).text.splitlines()


async def test_directory_without_slash_redirects(sim: Simulator, client: httpx.AsyncClient) -> None:
    r = await get(client, sim, "instance/scheduling")
    assert r.status_code == 301
    assert r.headers["location"].endswith("/computeMetadata/v1/instance/scheduling/")
    assert r.headers["Metadata-Flavor"] == "Google"


async def test_alt_json_on_a_value(sim: Simulator, client: httpx.AsyncClient) -> None:
    r = await get(client, sim, MAINT, alt="json")
    assert r.headers["content-type"] == "application/json"
    assert r.json() == "NONE"


async def test_any_key_can_be_set(sim: Simulator, client: httpx.AsyncClient) -> None:
    sim.gce.set("instance/attributes/role", "db")
    assert (await get(client, sim, "instance/attributes/role")).text == "db"
    assert (await get(client, sim, "instance/attributes/")).text == "role\n"


# -- ETag and long polling -------------------------------------------------------------------


async def test_etag_changes_on_every_change(sim: Simulator, client: httpx.AsyncClient) -> None:
    first = (await get(client, sim, MAINT)).headers["etag"]
    assert (await get(client, sim, MAINT)).headers["etag"] == first  # deterministic
    sim.gce.set(MAINT, "MIGRATE_ON_HOST_MAINTENANCE")
    second = (await get(client, sim, MAINT)).headers["etag"]
    sim.gce.set(MAINT, "NONE")
    third = (await get(client, sim, MAINT)).headers["etag"]
    assert len({first, second, third}) == 3  # back to NONE is still a new version


@pytest.mark.parametrize("flag", ["true", "True", "TRUE"])
async def test_wait_for_change_hangs_until_the_value_changes(
    sim: Simulator, client: httpx.AsyncClient, flag: str
) -> None:
    task = asyncio.create_task(get(client, sim, MAINT, wait_for_change=flag))
    await asyncio.sleep(0.2)
    assert not task.done()
    started = time.monotonic()
    sim.gce.set(MAINT, "MIGRATE_ON_HOST_MAINTENANCE")
    r = await task
    assert r.text == "MIGRATE_ON_HOST_MAINTENANCE"
    assert time.monotonic() - started < 0.5  # woken at once, not by a poll interval


async def test_last_etag_semantics(sim: Simulator, client: httpx.AsyncClient) -> None:
    current = (await get(client, sim, MAINT)).headers["etag"]
    # "0" and a stale etag return at once
    r = await asyncio.wait_for(get(client, sim, MAINT, wait_for_change="true", last_etag="0"), 1)
    assert r.text == "NONE"
    sim.gce.set(MAINT, "MIGRATE_ON_HOST_MAINTENANCE")
    r = await asyncio.wait_for(
        get(client, sim, MAINT, wait_for_change="true", last_etag=current), 1
    )
    assert r.text == "MIGRATE_ON_HOST_MAINTENANCE"
    # the current etag hangs until the next change
    task = asyncio.create_task(
        get(client, sim, MAINT, wait_for_change="true", last_etag=r.headers["etag"])
    )
    await asyncio.sleep(0.2)
    assert not task.done()
    sim.gce.set(MAINT, "NONE")
    assert (await asyncio.wait_for(task, 1)).text == "NONE"


async def test_timeout_sec_returns_current_value(sim: Simulator, client: httpx.AsyncClient) -> None:
    etag = (await get(client, sim, MAINT)).headers["etag"]
    started = time.monotonic()
    r = await get(client, sim, MAINT, wait_for_change="true", last_etag=etag, timeout_sec="1")
    elapsed = time.monotonic() - started
    assert (r.status_code, r.text, r.headers["etag"]) == (200, "NONE", etag)
    assert 0.9 <= elapsed < 2


async def test_bad_timeout_sec_is_400(sim: Simulator, client: httpx.AsyncClient) -> None:
    r = await get(client, sim, MAINT, wait_for_change="true", timeout_sec="soon")
    assert r.status_code == 400


async def test_wait_for_change_on_plain_directory_is_400(
    sim: Simulator, client: httpx.AsyncClient
) -> None:
    r = await get(client, sim, "instance/scheduling/", wait_for_change="true")
    assert r.status_code == 400
    assert r.headers["Metadata-Flavor"] == "Google"


async def test_wait_for_change_on_recursive_directory(
    sim: Simulator, client: httpx.AsyncClient
) -> None:
    task = asyncio.create_task(
        get(client, sim, "instance/", recursive="true", wait_for_change="true")
    )
    await asyncio.sleep(0.2)
    assert not task.done()
    sim.gce.set("instance/preempted", "TRUE")
    assert (await asyncio.wait_for(task, 1)).json()["preempted"] == "TRUE"


@pytest.mark.parametrize("key", ["instance/preempted", "instance/upcoming-maintenance"])
async def test_long_poll_on_preempted_and_upcoming(
    sim: Simulator, client: httpx.AsyncClient, key: str
) -> None:
    task = asyncio.create_task(get(client, sim, key, wait_for_change="true"))
    await asyncio.sleep(0.2)
    assert not task.done()
    if key == "instance/preempted":
        sim.gce.set(key, "TRUE")
    else:
        sim.gce.set_upcoming_maintenance({"maintenance_status": "PENDING"})
    r = await asyncio.wait_for(task, 1)
    assert r.status_code == 200
    assert r.text not in ("{}", "FALSE")


async def test_stop_releases_hanging_long_polls_promptly(client: httpx.AsyncClient) -> None:
    s = Simulator(provider="gce")
    await s.start()
    task = asyncio.create_task(get(client, s, MAINT, wait_for_change="true"))
    await asyncio.sleep(0.2)
    started = time.monotonic()
    await s.stop()
    r = await asyncio.wait_for(task, 2)
    assert r.text == "NONE"
    assert time.monotonic() - started < 1.5


# -- the 60-second warning rule -----------------------------------------------------------


async def test_maintenance_event_watched_flag(sim: Simulator, client: httpx.AsyncClient) -> None:
    assert not sim.gce.maintenance_event_watched
    await get(client, sim, "instance/", recursive="true")  # a parent directory does not count
    assert not sim.gce.maintenance_event_watched
    await get(client, sim, MAINT)
    assert sim.gce.maintenance_event_watched
    sim.gce.set(MAINT, "MIGRATE_ON_HOST_MAINTENANCE")
    assert sim.gce.maintenance_event_watched
    sim.gce.set(MAINT, "NONE")  # event over: a new query is needed for the next warning
    assert not sim.gce.maintenance_event_watched


async def test_live_migration_gives_60s_warning_only_when_watched(
    sim: Simulator, client: httpx.AsyncClient
) -> None:
    sim.load("gce-live-migration")
    await get(client, sim, MAINT)
    sim.clock.advance(120)
    assert sim.gce.get(MAINT) == "MIGRATE_ON_HOST_MAINTENANCE"

    sim.load("gce-live-migration")  # fresh VM: nobody queried the key
    sim.clock.advance(120)
    assert sim.gce.get(MAINT) == "NONE"  # warning skipped
    sim.clock.advance(60)
    assert sim.gce.get(MAINT) == "MIGRATE_ON_HOST_MAINTENANCE"  # appears as migration begins
    sim.clock.advance(15)
    assert sim.gce.get(MAINT) == "NONE"


# -- upcoming-maintenance quirks -------------------------------------------------------------

UPCOMING = "instance/upcoming-maintenance"


async def test_upcoming_nothing_scheduled_variants(
    sim: Simulator, client: httpx.AsyncClient
) -> None:
    r = await get(client, sim, UPCOMING)
    assert (r.status_code, r.text, r.headers["content-type"]) == (200, "{}", "application/json")
    sim.gce.quirks.upcoming_none = "NONE"
    r = await get(client, sim, UPCOMING)
    assert (r.status_code, r.text) == (200, "NONE")
    sim.gce.quirks.upcoming_none = "404"
    r = await get(client, sim, UPCOMING)
    assert r.status_code == 404
    assert r.headers["Metadata-Flavor"] == "Google"
    sim.gce.quirks.upcoming_none = "503"
    r = await get(client, sim, UPCOMING)
    assert r.status_code == 503
    assert r.json() == {"error": "no notifications have been received yet, try again later"}
    assert r.headers["Metadata-Flavor"] == "Google"
    with pytest.raises(ValueError, match="upcoming_none"):
        sim.gce.quirks.upcoming_none = "nothing"


async def test_upcoming_camel_case(sim: Simulator, client: httpx.AsyncClient) -> None:
    sim.gce.set_upcoming_maintenance(
        {
            "type": "SCHEDULED",
            "can_reschedule": True,
            "maintenance_status": "PENDING",
            "window_start_time": "2025-08-28T21:56:26Z",
            "window_end_time": "2025-08-29T01:56:20Z",
            "latest_window_start_time": "2025-08-28T21:56:21Z",
        }
    )
    r = await get(client, sim, UPCOMING)
    assert r.headers["content-type"] == "application/json"
    assert re.fullmatch(r"[0-9a-f]{16}", r.headers["etag"])
    body = r.json()
    assert list(body) == [
        "maintenanceType",
        "canReschedule",
        "latestWindowStartTime",
        "maintenanceStatus",
        "windowEndTime",
        "windowStartTime",
    ]
    assert body["canReschedule"] == "true"  # a string, as in Google's doc
    assert body["maintenanceStatus"] == "PENDING"


async def test_upcoming_snake_case(sim: Simulator, client: httpx.AsyncClient) -> None:
    sim.gce.quirks.upcoming_case = "snake"
    sim.gce.set_upcoming_maintenance(
        {"maintenanceType": "UNSCHEDULED", "canReschedule": "false", "maintenanceStatus": "ONGOING",
         "windowStartTime": "2025-08-28T21:56:26Z", "windowEndTime": "2025-08-29T01:56:20Z",
         "latestWindowStartTime": "2025-08-28T21:56:21Z"}
    )  # fmt: skip
    body = (await get(client, sim, UPCOMING)).json()
    assert body == {
        "type": "UNSCHEDULED",
        "can_reschedule": False,
        "latest_window_start_time": "2025-08-28T21:56:21Z",
        "maintenance_status": "ONGOING",
        "window_start_time": "2025-08-28T21:56:26Z",
        "window_end_time": "2025-08-29T01:56:20Z",
        "maintenance_reasons": [],
    }
    sim.gce.set_upcoming_maintenance(None)
    assert (await get(client, sim, UPCOMING)).text == "{}"


async def test_quirk_change_wakes_upcoming_long_poll(
    sim: Simulator, client: httpx.AsyncClient
) -> None:
    task = asyncio.create_task(get(client, sim, UPCOMING, wait_for_change="true"))
    await asyncio.sleep(0.2)
    sim.gce.quirks.upcoming_none = "503"
    assert (await asyncio.wait_for(task, 1)).status_code == 503


async def test_upcoming_scenario_window_times_are_wall_clock(
    client: httpx.AsyncClient,
) -> None:
    async with Simulator(provider="gce", scenario="gce-upcoming-maintenance", speed=100) as s:
        s.clock.advance(10)
        body = (await get(client, s, UPCOMING)).json()
        assert body["maintenanceStatus"] == "PENDING"
        start = calendar.timegm(time.strptime(body["windowStartTime"], "%Y-%m-%dT%H:%M:%SZ"))
        # 3600 sim seconds at speed 100 are 36 real seconds from now
        assert 30 <= start - time.time() <= 40
        s.clock.advance(3600)
        assert (await get(client, s, UPCOMING)).json()["maintenanceStatus"] == "ONGOING"
        s.clock.advance(30)
        assert (await get(client, s, UPCOMING)).text == "{}"


async def test_upcoming_cancelled_scenario(sim: Simulator, client: httpx.AsyncClient) -> None:
    sim.load("gce-upcoming-cancelled")
    sim.clock.advance(10)
    assert json.loads((await get(client, sim, UPCOMING)).text)["maintenanceStatus"] == "PENDING"
    sim.clock.advance(590)
    assert (await get(client, sim, UPCOMING)).text == "{}"
