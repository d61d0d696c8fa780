"""The `eventhubs` source against the repo's AMQP Event Hubs test server: the sidecars' real
Event Hubs sink sends, the official async consumer inside the fleet service reads every
partition, and the checkpoints live in the fleet store beside the events.

Nothing is mocked: tests/sinks/eventhub_server.py speaks AMQP 1.0 with the client's own
codec and serves receivers from a sequence number, as Event Hubs does.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import pytest
from azure.eventhub import EventData
from azure.eventhub.aio import EventHubProducerClient

from bridge.fleet.config import parse_fleet_config
from bridge.fleet.service import FleetService
from bridge.fleet.sources.eventhubs import EventHubsSource
from bridge.fleet.store import EventQuery, NoticeFilter
from bridge.infra.validation import ConfigError, validate
from bridge.pipeline.events import parse
from bridge.pipeline.model import Status
from bridge.sinkapi import Ok
from sinks.eventhubs import Config as SinkConfig
from sinks.eventhubs import create
from tests.fleet.factories import T0, azure_vm, gce_vm, heartbeat, transition
from tests.fleet.outage import FailingStore
from tests.sinks.eventhub_server import EventHubServer
from tests.support import eventually

VMS = [gce_vm("web-1"), gce_vm("web-2"), azure_vm("db-1"), azure_vm("db-2")]


def stream(round_: int) -> list[bytes]:
    bodies = []
    for vm in VMS:
        bodies.append(heartbeat(vm, T0, sequence=round_))
        bodies.append(transition(vm, f"{vm.name}-{round_}", Status.SCHEDULED, T0, not_before=T0))
    return bodies


@pytest.fixture
async def hub() -> AsyncIterator[EventHubServer]:
    async with EventHubServer(partitions=4) as server:
        yield server


def service_for(
    tmp_path: Path, hub: EventHubServer, store: FailingStore | None = None, **more: Any
) -> FleetService:
    raw = {
        "fleet": {
            "listener": {"port": 0},
            "store": {"url": f"sqlite://{tmp_path / 'fleet.sqlite3'}"},
            "sources": [
                {
                    "type": "eventhubs",
                    "connection_string": hub.connection_string,
                    "consumer_group": "fleet",
                    "batch_size": 50,
                    "retry_initial": 0.05,
                    "retry_max": 0.2,
                    **more,
                }
            ],
        }
    }
    return FleetService(parse_fleet_config(raw), store=store)


async def send(
    hub: EventHubServer, bodies: list[bytes], mode: Literal["binary", "structured"] = "binary"
) -> None:
    """Through the sidecars' own Event Hubs sink (partition key: the VM)."""
    settings = {"type": "eventhubs", "connection_string": hub.connection_string, "mode": mode}
    sink = create(validate(SinkConfig, settings), "eventhubs")
    try:
        assert isinstance(await sink.publish([parse(body) for body in bodies]), Ok)
    finally:
        await sink.close(5.0)


def last_sequences(hub: EventHubServer) -> dict[str, str]:
    return {
        pid: str(len(hub.events(int(pid))) - 1) for pid in hub.partition_ids if hub.events(int(pid))
    }


async def stored(service: FleetService, count: int) -> None:
    async def reached() -> bool:
        return (await service.store.counts())["events"] >= count

    await eventually(reached, timeout=30)


async def test_every_partition_is_read_and_checkpointed_with_its_events(
    tmp_path: Path, hub: EventHubServer
) -> None:
    binary, structured = stream(0), stream(1)
    await send(hub, binary, "binary")
    await send(hub, structured, "structured")
    assert len(last_sequences(hub)) > 1  # the VMs spread over several partitions
    service = service_for(tmp_path, hub)
    async with service.running():
        await stored(service, len(binary + structured))
        await eventually(lambda: service.sources[0].health().ok, timeout=10)
        assert await service.store.checkpoints("eventhubs") == last_sequences(hub)
        page = await service.store.events(EventQuery())
        got = {json.loads(row[3])["id"]: json.loads(row[3]) for row in page.rows}
        assert got == {json.loads(b)["id"]: json.loads(b) for b in binary + structured}
        notices = await service.store.notices(NoticeFilter())
        assert len(notices) == 2 * len(VMS)
        assert service.stats.counts[("eventhubs", "duplicate")] == 0


async def test_a_restart_resumes_after_the_checkpoints_with_no_gap_and_no_double(
    tmp_path: Path, hub: EventHubServer
) -> None:
    first, second = stream(0), stream(1)
    await send(hub, first)
    service = service_for(tmp_path, hub)
    async with service.running():
        await stored(service, len(first))
    await send(hub, second)  # while the fleet service is down
    again = service_for(tmp_path, hub)
    async with again.running():
        await stored(again, len(first + second))
        await eventually(
            lambda: again.stats.counts[("eventhubs", "accepted")] == len(second), timeout=10
        )
        assert again.stats.counts[("eventhubs", "duplicate")] == 0  # started after them
        assert await again.store.checkpoints("eventhubs") == last_sequences(hub)
    # A service started with `start = "latest"` and no checkpoint of its own reads nothing old.
    fresh = service_for(tmp_path, hub, name="late", start="latest")
    async with fresh.running():
        await eventually(lambda: fresh.sources[0].health().ok, timeout=10)
        assert fresh.stats.counts[("late", "accepted")] == 0


async def test_bad_messages_are_rejected_and_checkpointed_past(
    tmp_path: Path, hub: EventHubServer
) -> None:
    producer = EventHubProducerClient.from_connection_string(hub.connection_string)
    async with producer:
        batch = await producer.create_batch(partition_id="0")
        batch.add(EventData(b"{not json"))
        unknown = EventData(json.dumps({"specversion": "1.0", "id": "x", "type": "t"}))
        unknown.content_type = "application/cloudevents+json"
        batch.add(unknown)
        await producer.send_batch(batch)
    good = stream(0)[:1]
    await send(hub, good)
    service = service_for(tmp_path, hub)
    async with service.running():
        await stored(service, 1)
        await eventually(lambda: service.stats.counts[("eventhubs", "invalid")] == 2, timeout=30)
        assert len(await service.store.rejected()) == 2
        assert (await service.store.checkpoints("eventhubs"))["0"] == str(len(hub.events(0)) - 1)


async def test_while_the_store_fails_the_partition_waits_and_its_checkpoint_stays(
    tmp_path: Path, hub: EventHubServer
) -> None:
    bodies = stream(0)
    await send(hub, bodies)
    store = FailingStore(tmp_path / "fleet.sqlite3")
    service = service_for(tmp_path, hub, store=store)
    async with service.running():
        await eventually(lambda: store.attempts >= 3, timeout=30)
        health = service.sources[0].health()
        assert not health.ok
        assert "simulated outage" in health.detail
        assert await store.checkpoints("eventhubs") == {}
        store.failing = False
        await stored(service, len(bodies))
        await eventually(lambda: service.sources[0].health().ok, timeout=10)
        assert await store.checkpoints("eventhubs") == last_sequences(hub)
        assert service.stats.counts[("eventhubs", "accepted")] == len(bodies)


async def test_a_hub_down_at_start_is_read_once_it_is_back(
    tmp_path: Path, hub: EventHubServer
) -> None:
    bodies = stream(0)
    await send(hub, bodies)
    await hub.stop()
    service = service_for(tmp_path, hub)
    async with service.running():
        await eventually(lambda: "not consuming" in service.sources[0].health().detail, 60)
        await hub.start()
        await stored(service, len(bodies))
        await eventually(lambda: service.sources[0].health().ok, timeout=30)
        assert await service.store.checkpoints("eventhubs") == last_sequences(hub)


def test_a_connection_string_or_a_namespace_and_hub_is_required() -> None:
    with pytest.raises(ConfigError, match="connection_string"):
        parse_fleet_config({"fleet": {"sources": [{"type": "eventhubs"}]}})


async def test_events_out_of_the_stores_bounds_are_rejected_and_checkpointed_past(
    tmp_path: Path, hub: EventHubServer
) -> None:
    """Issue #29: each out-of-bounds event is one rejected message, checkpointed past."""
    from datetime import UTC, datetime

    from tests.fleet.poison import nested, poison

    bad = [*poison(datetime.now(UTC)).values(), nested(100_000)]
    producer = EventHubProducerClient.from_connection_string(hub.connection_string)
    async with producer:
        batch = await producer.create_batch(partition_id="0")
        for body in bad:
            data = EventData(body)
            data.content_type = "application/cloudevents+json"
            batch.add(data)
        await producer.send_batch(batch)
    await send(hub, stream(0)[:1])
    service = service_for(tmp_path, hub)
    async with service.running():
        await stored(service, 1)
        await eventually(
            lambda: service.stats.counts[("eventhubs", "invalid")] == len(bad), timeout=30
        )
        assert len(await service.store.rejected()) == len(bad)
        assert (await service.store.checkpoints("eventhubs"))["0"] == str(len(hub.events(0)) - 1)


async def test_a_receiver_process_that_dies_is_started_again_from_the_checkpoints(
    tmp_path: Path, hub: EventHubServer
) -> None:
    """The consumer runs in a receiver process of the source's own: killed, it is started
    again from the store's checkpoints, so what comes after is read once and nothing twice."""
    import psutil

    first, second = stream(0), stream(1)
    await send(hub, first)
    service = service_for(tmp_path, hub)
    async with service.running():
        await stored(service, len(first))
        source = service.sources[0]
        assert isinstance(source, EventHubsSource)
        pid = source.receiver_pid
        assert pid is not None
        assert pid != psutil.Process().pid
        psutil.Process(pid).kill()
        await eventually(lambda: "receiver process ended" in source.health().detail, timeout=30)
        await send(hub, second)
        await stored(service, len(first + second))
        await eventually(lambda: source.health().ok, timeout=30)
        assert source.receiver_pid not in (None, pid)
        assert await service.store.checkpoints("eventhubs") == last_sequences(hub)
        assert service.stats.counts[("eventhubs", "accepted")] == len(first + second)
        assert service.stats.counts[("eventhubs", "duplicate")] == 0
