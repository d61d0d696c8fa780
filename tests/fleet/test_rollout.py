"""Following a rollout: the fleet counts instances per sidecar version (each instance's last
heartbeat names its build), in `GET /v1/fleet/summary` and in a block of the page, the
filters of the page applied (a wave by zone shows that zone's versions)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import msgspec

from bridge import contract
from bridge.fleet.rollout import UNKNOWN, by_version
from bridge.pipeline.heartbeat import heartbeat_event
from bridge.pipeline.model import Instance, Kind, Status
from tests.fleet.conftest import FleetFactory
from tests.fleet.factories import gce_vm, transition
from tests.fleet.test_dashboard import Tables, post

OLD, NEW = "0.2.0+g1a2b3c4", "0.3.0+gfeedbee"


def beat(vm: Instance, version: str, age: timedelta = timedelta(0)) -> bytes:
    at = datetime.now(UTC) - age
    event = heartbeat_event(
        vm, sequence=0, started_at=at, interval=60, watcher_healthy=True, spool_depth=0, at=at
    )
    assert isinstance(event.data, contract.HeartbeatData)
    data = msgspec.structs.replace(event.data, agent_version=version)
    return contract.encode(msgspec.structs.replace(event, data=data))


def test_versions_are_counted_newest_release_first_unknown_last() -> None:
    now = 1_000_000.0
    fresh = {"last_heartbeat": now - 10, "heartbeat_interval": 60}
    gone = {"last_heartbeat": now - 3600, "heartbeat_interval": 60}
    rows: list[dict[str, object]] = [
        {**fresh, "agent_version": "0.10.0"},
        {**fresh, "agent_version": "0.9.1+gabc1234"},
        {**gone, "agent_version": "0.10.0"},
        {"agent_version": None, "last_heartbeat": None, "heartbeat_interval": None},
        {**fresh, "agent_version": "0.9.1+g0000000"},
    ]
    assert by_version(rows, now) == {
        "0.10.0": {"total": 2, "reporting": 1, "silent": 1},
        "0.9.1+g0000000": {"total": 1, "reporting": 1, "silent": 0},
        "0.9.1+gabc1234": {"total": 1, "reporting": 1, "silent": 0},
        UNKNOWN: {"total": 1, "reporting": 0, "silent": 1},
    }


async def test_a_wave_shows_in_the_summary_and_on_the_page(fleet_service: FleetFactory) -> None:
    a1, a2, b1 = gce_vm("a-1", "zone-a"), gce_vm("a-2", "zone-a"), gce_vm("b-1", "zone-b")
    b2, c1 = gce_vm("b-2", "zone-b"), gce_vm("c-1", "zone-c")
    async with fleet_service() as service, httpx.AsyncClient(base_url=service.url) as http:
        await post(
            http,
            beat(a1, NEW),  # zone-a is the first wave: upgraded
            beat(a2, NEW, age=timedelta(hours=1)),  # ... and one went silent after it
            beat(b1, OLD),
            beat(b2, OLD),
            # c-1 never sent a heartbeat: an old build, or heartbeats off.
            transition(c1, "n-1", Status.SCHEDULED, datetime.now(UTC), Kind.LIVE_MIGRATE),
        )
        summary = (await http.get("/v1/fleet/summary")).json()
        assert summary["instances"]["by_version"] == {
            NEW: {"total": 2, "reporting": 1, "silent": 1},
            OLD: {"total": 2, "reporting": 2, "silent": 0},
            UNKNOWN: {"total": 1, "reporting": 0, "silent": 1},
        }
        page = Tables((await http.get("/")).text)
        assert page.body("versions") == [
            [NEW, "1", "1", "2"],
            [OLD, "2", "0", "2"],
            [UNKNOWN, "0", "1", "1"],
        ]
        wave = Tables((await http.get("/?zone=zone-a")).text)
        assert wave.body("versions") == [[NEW, "1", "1", "2"]]
