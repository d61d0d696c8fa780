"""Two fleet replicas sharing one real PostgreSQL server: the same stream posted to both at
once (in different orders, batches overlapping) is stored once, and both answer the same.

The server comes from the machine's own binaries (tests/fleet/postgres_server.py: skipped
without them, failing under CI=true). The replicas are two `FleetService`s, each with its
own store connections and listener, fed through their real `POST /v1/events`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from bridge.fleet.config import parse_fleet_config
from bridge.fleet.service import FleetService, build_store
from bridge.fleet.store import Batch, Refused, StoreError
from bridge.pipeline.model import Kind, Status
from tests.fleet.factories import T0, azure_vm, gce_vm, heartbeat, transition
from tests.support import free_port

if TYPE_CHECKING:
    from tests.fleet.postgres_server import PostgresServer

pytest_plugins = ["tests.fleet.postgres_server"]

BATCH_TYPE = {"content-type": "application/cloudevents-batch+json"}
ANSWERS = (
    "/v1/fleet/notices",
    "/v1/fleet/instances",
    "/v1/fleet/summary",
    "/v1/fleet/upcoming?within=30d",
    "/v1/fleet/eligible?instance=web-0&instance=db-0&instance=db-1",
)


def stream() -> list[bytes]:
    """Ten VMs, each with heartbeats and a notice through its lifecycle (some unfinished)."""
    bodies: list[bytes] = []
    for index in range(10):
        vm = gce_vm(f"web-{index}") if index % 2 else azure_vm(f"db-{index}", scale_set="s")
        for beat in range(3):
            bodies.append(heartbeat(vm, T0 + timedelta(minutes=beat), sequence=beat))
        steps = [Status.SCHEDULED, Status.STARTED, Status.COMPLETED][: 1 + index % 3]
        for step, status in enumerate(steps):
            at = T0 + timedelta(minutes=5 * step)
            bodies.append(
                transition(
                    vm,
                    f"notice-{index}",
                    status,
                    at,
                    kind=Kind.LIVE_MIGRATE if index % 2 else Kind.REBOOT,
                    not_before=T0 + timedelta(days=1) if status is Status.SCHEDULED else None,
                )
            )
    return bodies


def batches(bodies: list[bytes], seed: int, size: int = 7) -> list[bytes]:
    """`bodies` shuffled with `seed` and cut into batch bodies of the HTTP binding."""
    order = list(bodies)
    random.Random(seed).shuffle(order)
    return [b"[" + b",".join(order[i : i + size]) + b"]" for i in range(0, len(order), size)]


@pytest.fixture
async def replicas(postgres_url: str) -> AsyncIterator[list[FleetService]]:
    raw = {
        "fleet": {
            "listener": {"port": 0},
            "store": {"url": postgres_url},
            "sources": [{"type": "http"}],
        }
    }
    async with AsyncExitStack() as stack:
        services = [FleetService(parse_fleet_config(raw)) for _ in range(2)]
        # Both create the tables at once: the schema lock makes that safe.
        await asyncio.gather(*(stack.enter_async_context(s.running()) for s in services))
        yield services


def timeless(path: str, answer: Any) -> Any:
    """`answer` without what depends on the moment it was asked (not on the state)."""
    if path.startswith("/v1/fleet/eligible"):  # reasons say "silent for N s"
        pairs = [(c["instance"], c["eligible"]) for c in answer["candidates"]]
        return answer["preferred"], pairs
    if path.startswith("/v1/fleet/upcoming"):
        for notice in answer["notices"]:
            notice.pop("seconds_until")
    return answer


async def post_all(client: httpx.AsyncClient, url: str, bodies: list[bytes]) -> list[Any]:
    answers = []
    for body in bodies:
        response = await client.post(url + "/v1/events", content=body, headers=BATCH_TYPE)
        assert response.status_code == 200, response.text
        answers.append(response.json())
    return answers


async def test_two_replicas_ingesting_the_same_stream_store_it_once_and_agree(
    replicas: list[FleetService],
) -> None:
    bodies = stream()
    async with httpx.AsyncClient(timeout=30) as client:
        first, second = await asyncio.gather(
            *(
                post_all(client, service.url, batches(bodies, seed=index))
                for index, service in enumerate(replicas)
            )
        )
        accepted = sum(a["accepted"] for a in first + second)
        duplicate = sum(a["duplicate"] for a in first + second)
        assert (accepted, duplicate) == (len(bodies), len(bodies))
        for path in ANSWERS:
            one, other = [(await client.get(s.url + path)).json() for s in replicas]
            assert timeless(path, one) == timeless(path, other), path
        summary = (await client.get(replicas[0].url + "/v1/fleet/summary")).json()
        assert summary["store"]["events"] == len(bodies)
        assert summary["store"]["instances"] == 10
        assert summary["store"]["notices"] == 10
        assert summary["notices_in_force"]["total"] == 7  # three of ten completed
        logged = await client.get(replicas[1].url + "/v1/fleet/events?limit=500")
        assert len(logged.json()) == len(bodies)
        assert len({(e["source"], e["id"]) for e in logged.json()}) == len(bodies)


async def test_refused_bytes_that_postgresql_text_cannot_hold_are_kept(
    postgres_url: str,
) -> None:
    store = build_store(postgres_url)
    await store.open()
    try:
        refused = Refused(b"\x00\xff{not json", "not JSON")
        result = await store.ingest(Batch("pubsub", T0.timestamp(), refused=[refused]))
        assert result.invalid == 1
        (row,) = await store.rejected()
        assert row["body"] == "\ufffd\ufffd{not json"
    finally:
        await store.close()


async def test_an_unreachable_server_is_a_store_error_without_the_password(
    postgres_server: PostgresServer,
) -> None:
    from bridge.fleet.postgres_store import redacted

    url = f"postgresql://fleet:hunter2@127.0.0.1:{free_port()}/fleet"
    store = build_store(url)
    assert "hunter2" not in repr(store)
    assert redacted(url) in repr(store)
    with pytest.raises(StoreError) as caught:
        await store.open()
    assert "hunter2" not in str(caught.value)
