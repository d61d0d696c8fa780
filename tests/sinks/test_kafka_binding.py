"""`bridge.transports.kafka_binding`: both content modes there and back, and the consumer
recipe that a fleet source follows (commit offsets only after the store commit), with a real
consumer group on librdkafka's mock cluster.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from cloudevents.core.v1.event import CloudEvent

from bridge.pipeline.events import as_dict, parse
from bridge.sinkapi import Ok
from bridge.transports.kafka_binding import (
    STRUCTURED_CONTENT_TYPE,
    BindingError,
    from_record,
    mode_of,
    to_record,
    to_structured_json,
)
from sinks import kafka
from tests.factories import fleet_events, instance, sample_events
from tests.sinks.kafka_mock import MockCluster
from tests.support import assert_valid, eventually


@pytest.mark.parametrize("mode", ["binary", "structured"])
def test_both_modes_decode_to_the_event_with_its_partition_key(mode: str) -> None:
    (event,) = sample_events(1)
    record = to_record(event, "binary" if mode == "binary" else "structured")
    assert record.key == event.get_source().encode()
    assert mode_of(record.headers) == mode
    decoded = from_record(record.headers, record.value, record.key)
    assert as_dict(decoded) == {**as_dict(event), "partitionkey": event.get_source()}
    assert_valid(json.loads(to_structured_json(record.headers, record.value, record.key)))


def test_an_existing_partition_key_is_kept_and_becomes_the_key() -> None:
    (event,) = sample_events(1)
    keyed = CloudEvent({**event.get_attributes(), "partitionkey": "rack-7"}, event.get_data())
    record = to_record(keyed, "binary")
    assert record.key == b"rack-7"
    assert ("ce_partitionkey", b"rack-7") in record.headers


def test_the_key_becomes_the_partition_key_of_an_event_without_one() -> None:
    """What a receiver does with events of other producers (the binding's key mapping)."""
    (event,) = sample_events(1)
    body = json.dumps(as_dict(event)).encode()
    headers = {"content-type": STRUCTURED_CONTENT_TYPE}
    assert from_record(headers, body, b"vm-7").get_extension("partitionkey") == "vm-7"
    assert from_record(headers, body).get_extension("partitionkey") is None
    # Headers as confluent-kafka delivers them: a list of pairs, names in any case.
    binary = to_record(event, "binary")
    upper = [(name.upper(), value) for name, value in binary.headers]
    assert from_record(upper, binary.value).get_id() == event.get_id()


def test_messages_that_are_no_cloudevent_are_refused_clearly() -> None:
    with pytest.raises(BindingError, match="not a CloudEvent"):
        from_record([("content-type", b"text/plain")], b"hello")
    with pytest.raises(BindingError, match="not a valid CloudEvent"):
        from_record(None, b'{"id": "1"}')
    with pytest.raises(BindingError, match="not a valid CloudEvent"):
        from_record([("ce_id", b"1"), ("content-type", b"application/json")], b"{not json")
    with pytest.raises(BindingError, match="not UTF-8"):
        from_record([("ce_id", b"\xff")], b"{}")


def test_non_json_data_travels_as_bytes() -> None:
    event = CloudEvent(
        {"id": "1", "source": "/s", "type": "t", "datacontenttype": "text/plain"}, b"\x00\x01"
    )
    record = to_record(event, "binary")
    assert record.value == b"\x00\x01"
    assert from_record(record.headers, record.value).get_data() == b"\x00\x01"


# --- the consumer side of a fleet, on a real consumer group -------------------------------


class Store:
    """What a fleet store must be for at-least-once input: keyed by (source, id)."""

    def __init__(self) -> None:
        self.events: dict[tuple[str, str], bytes] = {}
        self.redelivered = 0
        #: Which group member holds which partitions, and how many events each stored.
        self.assigned: dict[str, list[int]] = {}
        self.stored_by: dict[str, int] = {}
        self._lock = threading.Lock()

    def commit(self, structured: bytes, member: str = "consumer") -> None:
        event = parse(structured)
        key = (event.get_source(), event.get_id())
        with self._lock:
            if key in self.events:
                self.redelivered += 1
            self.events[key] = structured
            self.stored_by[member] = self.stored_by.get(member, 0) + 1


def consume(
    cluster: MockCluster,
    topic: str,
    group: str,
    store: Store,
    count: int,
    stop: threading.Event | None = None,
    member: str = "consumer",
) -> None:
    """The fleet-source recipe: decode, commit to the store, then (only then) the offset.

    Stops after `count` messages as if killed right after the last store commit, before its
    offset commit: the restarted consumer gets that message again and the store absorbs it.
    With `stop`, it also stops (cleanly) once that is set.
    """
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            # The mock cluster waits out a departed member's session before it rebalances.
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "log_level": 3,
        }
    )
    consumer.subscribe(
        [topic],
        on_assign=lambda _, parts: store.assigned.update({member: [p.partition for p in parts]}),
    )
    handled = 0
    try:
        while handled < count and not (stop and stop.is_set()):
            message = consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            body = to_structured_json(message.headers(), message.value(), message.key())
            store.commit(body, member)
            handled += 1
            if handled < count:
                consumer.commit(message=message, asynchronous=False)
    finally:
        consumer.close()


async def test_a_consumer_restarted_mid_stream_loses_nothing_and_doubles_nothing(
    kafka_cluster: MockCluster,
) -> None:
    topic = kafka_cluster.create_topic(partitions=1)
    events = [e for name in ("vm-a", "vm-b") for e in sample_events(15, instance(name))]
    for mode in ("binary", "structured"):  # both modes in one topic, as mixed producers do
        config = kafka.Config(
            bootstrap_servers=kafka_cluster.bootstrap.split(","), topic=topic, mode=mode
        )
        sink = kafka.create(config, "kafka")
        half = events[:15] if mode == "binary" else events[15:]
        try:
            assert isinstance(await sink.publish(half), Ok)
        finally:
            await sink.close(5.0)

    store = Store()
    await asyncio.to_thread(consume, kafka_cluster, topic, "fleet", store, 12)
    assert len(store.events) == 12
    await asyncio.to_thread(consume, kafka_cluster, topic, "fleet", store, len(events) - 12 + 1)

    assert store.redelivered == 1  # the one message whose offset commit the "crash" lost
    stored: list[dict[str, Any]] = [
        assert_valid(json.loads(body)) for body in store.events.values()
    ]
    assert [e["id"] for e in stored] == [e.get_id() for e in events]
    assert stored == [{**as_dict(e), "partitionkey": e.get_source()} for e in events]


async def test_a_consumer_joining_mid_stream_rebalances_without_losing_anything(
    kafka_cluster: MockCluster,
) -> None:
    """Two members of one group, the second joining while the first is reading: the
    partitions move between them, every event is stored, at most a few are read twice."""
    topic = kafka_cluster.create_topic(partitions=4)
    events = fleet_events(per_vm=20)
    sink = kafka.create(
        kafka.Config(bootstrap_servers=kafka_cluster.bootstrap.split(","), topic=topic), "kafka"
    )
    store = Store()
    stop = threading.Event()
    first = asyncio.create_task(
        asyncio.to_thread(consume, kafka_cluster, topic, "fleet", store, 10**6, stop, "first")
    )
    second: asyncio.Task[None] | None = None
    try:
        assert isinstance(await sink.publish(events[:30]), Ok)
        await eventually(lambda: len(store.events) >= 10, timeout=30.0)
        second = asyncio.create_task(
            asyncio.to_thread(consume, kafka_cluster, topic, "fleet", store, 10**6, stop, "second")
        )
        await eventually(lambda: len(store.assigned.get("second", [])) > 0, timeout=30.0)
        assert isinstance(await sink.publish(events[30:]), Ok)
        await eventually(lambda: len(store.events) == len(events), timeout=60.0)
    finally:
        stop.set()
        await sink.close(5.0)
        await asyncio.gather(first, *([second] if second else []))

    stored = [assert_valid(json.loads(body)) for body in store.events.values()]
    assert sorted(e["id"] for e in stored) == sorted(e.get_id() for e in events)
    assert store.redelivered <= 4  # at most the message in flight per partition moved
    assert sorted(store.assigned["first"] + store.assigned["second"]) == [0, 1, 2, 3]
    # The VMs' keys hash to partitions 0, 1 and 3: whichever half the newcomer got, it
    # stored events of its own.
    assert store.stored_by["second"] > 0
