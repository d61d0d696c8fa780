"""The fleet API over HTTP, on a fleet fed through POST /v1/events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.fleet.api import INSTANCE_TIMES
from bridge.fleet.service import FleetService
from bridge.infra.timeparse import parse_time
from tests.fleet.conftest import FleetFactory
from tests.fleet.world import FLEET, minutes


@pytest.fixture
async def api(fleet_service: FleetFactory) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        fleet_service(api={"page_size": 5}) as service,
        httpx.AsyncClient(base_url=service.url) as http,
    ):
        batch = b"[" + b",".join(FLEET) + b"]"
        headers = {"content-type": "application/cloudevents-batch+json"}
        answer = await http.post("/v1/events", content=batch, headers=headers)
        assert answer.status_code == 200, answer.text
        yield http


async def get(http: httpx.AsyncClient, path: str, status: int = 200) -> Any:
    answer = await http.get(path)
    assert answer.status_code == status, answer.text
    return answer.json()


async def test_notices_in_force_with_filters(api: httpx.AsyncClient) -> None:
    async def ids(query: str = "") -> list[str]:
        body = await get(api, "/v1/fleet/notices" + query)
        return sorted(n["notice_id"] for n in body["notices"])

    assert await ids() == ["ev-1", "ev-2", "g-1", "g-2"]  # ev-0 completed
    assert await ids("?provider=azure") == ["ev-1", "ev-2"]
    assert await ids("?zone=europe-west1-b") == ["g-2"]
    assert await ids("?kind=live-migrate&status=started") == ["g-1"]
    assert await ids("?instance=db-2") == ["ev-2"]
    (notice,) = (await get(api, "/v1/fleet/notices?instance=db-1"))["notices"]
    assert notice["event"]["type"] == "io.maintenancebridge.maintenance.scheduled"
    assert [t["status"] for t in notice["transitions"]] == ["scheduled"]


async def test_upcoming_lists_scheduled_notices_soonest_first(api: httpx.AsyncClient) -> None:
    body = await get(api, "/v1/fleet/upcoming?within=24h")
    assert [n["notice_id"] for n in body["notices"]] == ["ev-1", "ev-2"]
    assert [n["notice_id"] for n in body["time_unknown"]] == ["g-2"]
    soon = await get(api, "/v1/fleet/upcoming?within=1h")
    assert [n["notice_id"] for n in soon["notices"]] == ["ev-1"]
    assert 0 < soon["notices"][0]["seconds_until"] <= 600
    await get(api, "/v1/fleet/upcoming?within=soon", status=400)


async def test_instances_are_reporting_or_silent(api: httpx.AsyncClient) -> None:
    body = await get(api, "/v1/fleet/instances")
    states = {i["name"]: (i["state"], i["notices"]) for i in body["instances"]}
    assert states == {
        "db-1": ("reporting", ["ev-1"]),
        "db-2": ("reporting", ["ev-2"]),
        "quiet-1": ("silent", []),
        "web-1": ("reporting", ["g-1"]),
        "web-2": ("reporting", ["g-2"]),
    }
    silent = await get(api, "/v1/fleet/instances?state=silent")
    assert [i["name"] for i in silent["instances"]] == ["quiet-1"]
    assert "last heartbeat" in silent["instances"][0]["state_reason"]


async def test_instance_times_are_rfc3339_beside_the_deprecated_floats(
    api: httpx.AsyncClient,
) -> None:
    body = await get(api, "/v1/fleet/instances")
    for instance in body["instances"]:
        for old, new in INSTANCE_TIMES.items():
            if instance[old] is None:
                assert instance[new] is None
                continue
            assert instance[new].endswith("Z"), (old, new, instance[new])
            assert parse_time(instance[new]).timestamp() == pytest.approx(instance[old], abs=1e-5)
    (db1,) = [i for i in body["instances"] if i["name"] == "db-1"]
    assert db1["last_heartbeat_at"] is not None


async def test_one_instance_by_name_or_source_and_unknown_is_404(api: httpx.AsyncClient) -> None:
    listed = {i["name"]: i for i in (await get(api, "/v1/fleet/instances"))["instances"]}
    one = await get(api, "/v1/fleet/instances/db-1")
    assert one == listed["db-1"]
    by_source = await get(api, "/v1/fleet/instances/" + quote(one["source"], safe=""))
    assert by_source == one
    missing = await api.get("/v1/fleet/instances/nobody")
    assert missing.status_code == 404
    assert missing.headers["content-type"].startswith("application/json")
    assert missing.json() == {"error": "no instance named 'nobody' reached the fleet"}


async def test_eligible_answers_each_candidate_and_prefers_the_first_safe_one(
    api: httpx.AsyncClient,
) -> None:
    query = "instance=web-1&instance=db-1&instance=nobody&instance=quiet-1&instance=db-2"
    body = await get(api, f"/v1/fleet/eligible?{query}&horizon=3600")
    answers = {a["instance"]: (a["eligible"], a["reason"]) for a in body["candidates"]}
    assert answers["web-1"][0] is False
    assert "started" in answers["web-1"][1]
    assert answers["db-1"][0] is False
    assert "within the horizon" in answers["db-1"][1]
    assert answers["nobody"] == (False, "unknown instance")
    assert answers["quiet-1"][0] is False
    assert answers["quiet-1"][1].startswith("silent")
    assert answers["db-2"] == (True, "maintenance scheduled, but beyond the horizon")
    assert body["preferred"] == "db-2"
    none = await get(api, "/v1/fleet/eligible?instance=web-1&instance=db-1", status=503)
    assert none["preferred"] is None
    await get(api, "/v1/fleet/eligible", status=400)


async def test_summary_counts_by_provider_zone_kind_status(api: httpx.AsyncClient) -> None:
    body = await get(api, "/v1/fleet/summary")
    assert body["instances"] | {"by_provider": None, "by_version": None} == {
        "total": 5,
        "reporting": 4,
        "silent": 1,
        "retired": 0,
        "by_provider": None,
        "by_version": None,
        # a fleet without [fleet.identity]: no instance's events are checked
        "by_attestation": {"attested": 0, "unattested": 0, "unchecked": 5},
    }
    versions = body["instances"]["by_version"].values()  # tests/fleet/test_rollout.py
    assert sum(row["total"] for row in versions) == 5
    notices = body["notices_in_force"]
    assert notices["total"] == 4
    assert notices["by_provider"] == {"azure": 2, "gce": 2}
    assert notices["by_status"] == {"scheduled": 3, "started": 1}
    assert notices["by_kind"] == {"reboot": 2, "live-migrate": 1, "terminate": 1}


async def test_the_audit_log_pages_as_cloudevents_batches(api: httpx.AsyncClient) -> None:
    received: list[bytes] = []
    path: str | None = "/v1/fleet/events"
    pages = 0
    while path is not None:
        answer = await api.get(path)
        assert answer.headers["content-type"].startswith("application/cloudevents-batch+json")
        received += [json.dumps(e).encode() for e in answer.json()]
        link = answer.headers.get("link")
        path = link[1 : link.index(">")] if link else None
        pages += 1
    assert pages == 3  # 11 events, 5 per page
    assert [json.loads(b) for b in received] == [json.loads(b) for b in FLEET]
    completed = "io.maintenancebridge.maintenance.completed"
    only = await api.get("/v1/fleet/events", params={"instance": "db-2", "type": completed})
    assert [e["data"]["notice_id"] for e in only.json()] == ["ev-0"]
    window = {"since": minutes(-45).isoformat(), "until": str(minutes(-20).timestamp())}
    since = await api.get("/v1/fleet/events", params=window)
    assert [e["type"] for e in since.json()] == [completed]
    assert (await api.get("/v1/fleet/events?since=yesterday")).status_code == 400
    naive = await api.get("/v1/fleet/events", params={"since": "2026-11-23T10:00:00"})
    assert naive.status_code == 400  # a person's local time is not guessed to be UTC
    assert "needs an offset" in naive.text


async def test_metrics_health_and_readiness(api: httpx.AsyncClient) -> None:
    text = (await api.get("/metrics")).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    in_force = {
        (s.labels["provider"], s.labels["kind"], s.labels["status"]): s.value
        for s in families["fleet_notices_in_force"].samples
    }
    assert in_force[("gce", "live-migrate", "started")] == 1
    instances = {s.labels["state"]: s.value for s in families["fleet_instances"].samples}
    assert instances == {"reporting": 4, "silent": 1}
    ingest = {
        s.labels["outcome"]: s.value
        for s in families["fleet_ingest_events"].samples
        if s.name.endswith("_total")
    }
    assert ingest == {"accepted": len(FLEET), "duplicate": 0, "invalid": 0}
    lag = [s for s in families["fleet_ingest_lag_seconds"].samples if s.name.endswith("_count")]
    assert lag[0].value == len(FLEET)
    assert (await api.get("/healthz")).status_code == 200
    ready = await get(api, "/readyz")
    assert [c["name"] for c in ready["checks"]] == ["store", "source:http"]


async def test_readyz_fails_when_the_store_is_gone(fleet_service: FleetFactory) -> None:
    async with fleet_service() as service, httpx.AsyncClient(base_url=service.url) as http:
        await _break(service)
        answer = await http.get("/readyz")
        assert answer.status_code == 503
        assert answer.json()["checks"][0]["ok"] is False
        assert (await http.get("/v1/fleet/notices")).status_code == 503


async def _break(service: FleetService) -> None:
    """Close the store under the running service (what a lost database looks like)."""
    from bridge.fleet.sqlite_store import SqliteStore

    store = service.store
    assert isinstance(store, SqliteStore)
    read = store._read_db
    assert read is not None
    read.close()


async def test_an_unknown_path_under_v1_is_a_json_404(fleet_service: FleetFactory) -> None:
    """Every answer of the API is JSON, aiohttp's own 404 for a path no route matches too
    (here a name with a line break, which no route takes)."""
    async with fleet_service() as service, httpx.AsyncClient(base_url=service.url) as http:
        for path in ("/v1/fleet/instances/%0A%7C", "/v1/fleet/nothing-here"):
            answer = await http.get(path)
            assert answer.status_code == 404
            assert answer.headers["content-type"].startswith("application/json")
            assert "error" in answer.json()
