"""The Event Hubs sink, through the official azure-eventhub client, against the test server.

Nothing is mocked: the real async producer sends to `EventHubServer` over AMQP, and the real
async consumer reads every event back, which is rebuilt with the cloudevents SDK's AMQP
binding and validated against the JSON Schema.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import EventData
from azure.eventhub.aio import EventHubConsumerClient, PartitionContext
from cloudevents.core.bindings import amqp
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from bridge.config import ConfigError
from bridge.infra.validation import validate
from bridge.pipeline.dispatch import Dispatcher
from bridge.pipeline.events import as_dict, serialize
from bridge.pipeline.spool import NewEvent, Spool
from bridge.sinkapi import Ok, Reject, Sink
from sinks.eventhubs import Config, EventHubsSink, create
from tests.factories import instance, sample_events
from tests.sinks.contract import SinkContract
from tests.sinks.eventhub_server import EventHubServer
from tests.support import assert_valid, eventually

KEY = "s3cr3t-shared-access-key"


def sink_for(server: EventHubServer, mode: str = "binary", hub: str | None = None) -> Sink:
    text = server.connection_string_for(hub or server.hub).replace(
        "SharedAccessKey=v", f"SharedAccessKey={KEY}"
    )
    config = validate(
        Config, {"type": "eventhubs", "connection_string": text, "mode": mode, "timeout": 3.0}
    )
    return create(config, "eventhubs")


def to_cloudevent(data: EventData) -> CloudEvent:
    """What a consumer does: rebuild the CloudEvent with the SDK's AMQP binding."""
    properties = {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in (data.properties or {}).items()
    }
    message = amqp.AMQPMessage(
        properties={"content-type": data.content_type or ""},
        application_properties=properties,
        application_data=b"".join(data.body),  # type: ignore[arg-type]
    )
    event = amqp.from_amqp(message, JSONFormat(), CloudEvent)
    assert isinstance(event, CloudEvent)
    return event


async def read_partition(
    server: EventHubServer, pid: str, timeout: float = 10.0
) -> list[EventData]:
    """Every event of one partition, read with the real async consumer."""
    expected = len(server.events(int(pid)))
    got: list[EventData] = []
    done = asyncio.Event()

    async def on_batch(_: PartitionContext, batch: list[EventData]) -> None:
        got.extend(batch)
        if len(got) >= expected:
            done.set()

    if expected == 0:
        return []
    consumer = EventHubConsumerClient.from_connection_string(
        server.connection_string, consumer_group="$Default", retry_total=0
    )
    async with consumer:
        task = asyncio.create_task(
            consumer.receive_batch(
                on_batch, partition_id=pid, starting_position="-1", max_wait_time=0.2
            )
        )
        try:
            await asyncio.wait_for(done.wait(), timeout)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return got


async def read_all(server: EventHubServer) -> dict[str, list[EventData]]:
    """Every partition, read concurrently (each consumer takes a moment to attach)."""
    pids = server.partition_ids
    batches = await asyncio.gather(*(read_partition(server, pid) for pid in pids))
    return dict(zip(pids, batches, strict=True))


class TestEventHubsContract(SinkContract):
    @pytest.fixture(autouse=True)
    async def _server(self) -> AsyncIterator[None]:
        async with EventHubServer() as server:
            self.server = server
            yield

    async def make_sink(self) -> Sink:
        return sink_for(self.server)

    async def received(self) -> list[dict[str, Any]]:
        events = [e for batch in (await read_all(self.server)).values() for e in batch]
        return [assert_valid(to_cloudevent(e)) for e in events]

    async def make_transient_failure(self) -> None:
        await self.server.stop()

    async def make_permanent_failure(self) -> None:
        self.server.delete_hub()

    def secrets(self) -> list[str]:
        return [KEY]


@pytest.fixture
async def server() -> AsyncIterator[EventHubServer]:
    async with EventHubServer() as running:
        yield running


def interleaved(per_vm: int, vms: Sequence[str]) -> list[CloudEvent]:
    streams = [sample_events(per_vm, instance(name)) for name in vms]
    return [stream[i] for i in range(per_vm) for stream in streams]


async def publish_all(sink: Sink, events: Sequence[CloudEvent]) -> None:
    for start in range(0, len(events), 7):
        result = await sink.publish(events[start : start + 7])
        assert isinstance(result, Ok), result


@pytest.mark.parametrize("mode", ["binary", "structured"])
async def test_events_round_trip_one_partition_per_vm_in_order(
    server: EventHubServer, mode: str
) -> None:
    vms = ["vm-a", "vm-b", "vm-c", "vm-d", "vm-e"]
    events = interleaved(4, vms)
    sink = sink_for(server, mode)
    try:
        await publish_all(sink, events)
    finally:
        await sink.close(5.0)

    partitions = await read_all(server)
    assert sum(map(len, partitions.values())) == len(events)
    seen: dict[str, str] = {}
    by_source: dict[str, list[dict[str, Any]]] = {}
    for pid, batch in partitions.items():
        for data in batch:
            event = to_cloudevent(data)
            source = event.get_source()
            assert seen.setdefault(source, pid) == pid, "a VM's events span partitions"
            assert data.partition_key in (source, source.encode())
            by_source.setdefault(source, []).append(assert_valid(event))
            if mode == "structured":
                assert data.content_type is not None
                assert data.content_type.startswith("application/cloudevents+json")
                assert not data.properties
            else:
                assert data.content_type == "application/json"
                assert data.properties[b"cloudEvents_id"] == event.get_id().encode()
    for source, got in by_source.items():
        expected = [as_dict(e) for e in events if e.get_source() == source]
        assert got == expected
    assert len(by_source) == len(vms)


async def test_event_over_the_size_limit_is_rejected_and_nothing_sent(
    server: EventHubServer,
) -> None:
    small = sample_events(1)[0]
    big = CloudEvent({**small.get_attributes(), "id": "too-big"}, {"raw": "x" * (1024 * 1024 + 10)})
    sink = sink_for(server)
    try:
        result = await sink.publish([small, big])
    finally:
        await sink.close(5.0)
    assert isinstance(result, Reject), result
    assert "too large" in result.reason
    assert "too-big" in result.reason
    assert sum(len(server.events(int(p))) for p in server.partition_ids) == 0


async def test_unknown_hub_is_reject(server: EventHubServer) -> None:
    sink = sink_for(server, hub="no-such-hub")
    try:
        result = await sink.publish(sample_events(1))
    finally:
        await sink.close(5.0)
    assert isinstance(result, Reject), result
    assert "does not exist" in result.reason


async def test_refused_token_is_reject(server: EventHubServer) -> None:
    server.refuse_tokens = True
    sink = sink_for(server)
    try:
        result = await sink.publish(sample_events(1))
    finally:
        await sink.close(5.0)
    assert isinstance(result, Reject), result
    assert "Data Sender" in result.reason


async def test_healthcheck(server: EventHubServer) -> None:
    sink = sink_for(server)
    try:
        health = await sink.healthcheck()
        assert health.ok, health.detail
        assert "4 partitions" in health.detail
        await server.stop()
        health = await sink.healthcheck()
        assert not health.ok
        assert health.detail
    finally:
        await sink.close(5.0)


async def test_outage_mid_run_is_retried_and_nothing_lost(
    server: EventHubServer, tmp_path: Path
) -> None:
    events = interleaved(6, ["vm-x", "vm-y", "vm-z"])
    sink = sink_for(server)
    spool = Spool(tmp_path, [sink.name])
    await spool.open()
    dispatcher = Dispatcher(spool, [sink], retry_initial=0.05, retry_max=0.5)
    dispatcher.start()

    async def commit(batch: Sequence[CloudEvent]) -> None:
        await spool.commit(
            [NewEvent(e.get_id(), e.get_source(), e.get_type(), serialize(e)) for e in batch]
        )
        dispatcher.notify()

    async def wait_delivered(count: int) -> None:
        await eventually(lambda: dispatcher.stats[sink.name].delivered >= count, timeout=15.0)

    try:
        await commit(events[:6])
        await wait_delivered(6)
        await server.stop()
        await commit(events[6:12])
        await eventually(lambda: dispatcher.stats[sink.name].retried >= 2, timeout=15.0)
        assert dispatcher.stats[sink.name].delivered == 6
        await commit(events[12:])
        await server.start()
        await wait_delivered(len(events))
    finally:
        await dispatcher.stop(5.0)
        await spool.close()

    assert dispatcher.stats[sink.name].dead_lettered == 0
    got = [to_cloudevent(e) for batch in (await read_all(server)).values() for e in batch]
    assert {(e.get_source(), e.get_id()) for e in got} == {
        (e.get_source(), e.get_id()) for e in events
    }
    for source in {e.get_source() for e in events}:
        first_seen: list[str] = []
        for event in got:
            if event.get_source() == source and event.get_id() not in first_seen:
                first_seen.append(event.get_id())
        assert first_seen == [e.get_id() for e in events if e.get_source() == source]


def test_config_needs_exactly_one_way_to_connect() -> None:
    with pytest.raises(ConfigError, match="connection_string"):
        validate(Config, {"type": "eventhubs"})
    with pytest.raises(ConfigError, match="not both"):
        validate(
            Config,
            {
                "type": "eventhubs",
                "connection_string": "Endpoint=sb://x/;SharedAccessKeyName=k;SharedAccessKey=v",
                "fully_qualified_namespace": "ns.servicebus.windows.net",
                "eventhub": "hub",
            },
        )
    with pytest.raises(ConfigError):
        validate(Config, {"type": "eventhubs", "fully_qualified_namespace": "ns"})
    with pytest.raises(ConfigError):
        validate(Config, {"type": "eventhubs", "connection_string": "x", "mode": "json"})


async def test_connection_string_from_env_and_managed_identity_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = f"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey={KEY};EntityPath=hub"
    monkeypatch.setenv("EH_CONN", text)
    config = validate(Config, {"type": "eventhubs", "connection_string": "env:EH_CONN"})
    assert config.connection_string is not None
    assert config.connection_string.get_secret_value() == text
    assert KEY not in repr(config)
    sink = create(config, "eh")
    assert isinstance(sink, EventHubsSink)
    assert sink.target == "hub"
    await sink.close(1.0)

    aad = validate(
        Config,
        {
            "type": "eventhubs",
            "fully_qualified_namespace": "ns.servicebus.windows.net",
            "eventhub": "maintenance",
            "transport": "websockets",
        },
    )
    sink = create(aad, "eh-aad")  # builds DefaultAzureCredential; nothing connects yet
    assert isinstance(sink, EventHubsSink)
    assert sink.target == "maintenance"
    await sink.close(1.0)


def test_module_does_not_import_the_sdk() -> None:
    code = (
        "import sys, json\n"
        "import sinks.eventhubs as m\n"
        "from bridge.infra.validation import validate\n"
        "validate(m.Config, {'type': 'eventhubs', 'connection_string': 'Endpoint=sb://x/'})\n"
        "print(json.dumps(sorted(n for n in sys.modules if n.startswith('azure'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert json.loads(out.stdout) == []


async def test_close_keeps_the_deadline_when_the_hub_is_gone(server: EventHubServer) -> None:
    sink = sink_for(server)
    assert isinstance(await sink.publish(sample_events(2)), Ok)
    await server.stop()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await sink.close(1.0)
    assert loop.time() - started < 1.5


async def test_consumer_can_start_from_a_sequence_number(server: EventHubServer) -> None:
    """The server honours the consumer's selector filter (as the real service does)."""
    sink = sink_for(server)
    events = sample_events(5)
    try:
        assert isinstance(await sink.publish(events), Ok)
    finally:
        await sink.close(5.0)
    (pid,) = [p for p in server.partition_ids if server.events(int(p))]
    got: list[EventData] = []
    done = asyncio.Event()

    async def on_event(_: PartitionContext, event: EventData | None) -> None:
        if event is not None:
            got.append(event)
        if len(got) == 3:
            done.set()

    consumer = EventHubConsumerClient.from_connection_string(
        server.connection_string, consumer_group="$Default"
    )
    async with consumer:
        task = asyncio.create_task(
            consumer.receive(on_event, partition_id=pid, starting_position=1)
        )
        try:
            await asyncio.wait_for(done.wait(), 10)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert [e.sequence_number for e in got] == [2, 3, 4]
    assert [to_cloudevent(e).get_id() for e in got] == [e.get_id() for e in events[2:]]
    assert all(e.enqueued_time is not None for e in got)
