"""The `kafka` source against librdkafka's mock cluster: the sidecars' real Kafka sink (or a
plain `Producer`, for messages no sink would write) produces, the real fleet service consumes
into its store through a consumer group.

Offsets are checked the way Kafka shows them: after the service stopped, the group's
committed offsets are the partitions' ends (everything the store holds was committed past,
poison included). Restarts in process, a `kill -9` of a `maintenance-bridge fleet` process
and a second replica joining the group mid-stream all end with every event in the store
exactly once. The mock cluster comes from tests/sinks/kafka_mock.py (skipped without
confluent-kafka, failing under CI=true); nothing of ours stands in for Kafka.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from cloudevents.core.v1.event import CloudEvent

from bridge.config import ConfigError
from bridge.fleet.config import parse_fleet_config
from bridge.fleet.kafka_config import KafkaSourceConfig
from bridge.fleet.service import FleetService, build_store
from bridge.fleet.sources.base import SourceHealth
from bridge.fleet.store import EventQuery
from bridge.infra.validation import validate
from bridge.pipeline.events import serialize
from bridge.sinkapi import Ok
from sinks import kafka
from tests.factories import fleet_events
from tests.fleet.buses import toml_table
from tests.fleet.test_bus_end_to_end import Process
from tests.sinks.kafka_mock import MockCluster, require_library
from tests.support import assert_valid, eventually, free_port

pytest_plugins = ["tests.fleet.postgres_server"]

ROOT = Path(__file__).resolve().parents[2]
GROUP = "fleet"
EVENTHUBS_CONNECTION = (
    "Endpoint=sb://fleet-ns.servicebus.windows.net/;SharedAccessKeyName=listen;"
    "SharedAccessKey=c2VjcmV0LWtleQ==;EntityPath=maintenance"
)


@pytest.fixture
def cluster() -> Iterator[MockCluster]:
    """A three-broker mock cluster shared by the producers, the fleet service and the checks."""
    mock = MockCluster(require_library())
    mock.start()
    try:
        yield mock
    finally:
        mock.stop()


@pytest.fixture
def topic(cluster: MockCluster) -> str:
    """A topic of four partitions on the cluster."""
    return cluster.create_topic(partitions=4)


def source(cluster: MockCluster, topic: str, **more: Any) -> dict[str, Any]:
    return {
        "type": "kafka",
        "bootstrap_servers": cluster.bootstrap.split(","),
        "topic": topic,
        "group_id": GROUP,
        "batch_wait": 0.02,
        "retry_initial": 0.05,
        "retry_max": 0.2,
        # The mock cluster waits out a departed member's session before it rebalances.
        "options": {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
        **more,
    }


def service_for(tmp_path: Path, cluster: MockCluster, topic: str, **more: Any) -> FleetService:
    raw = {
        "fleet": {
            "listener": {"port": 0},
            "store": {"url": f"sqlite://{tmp_path / 'fleet.sqlite3'}"},
            "sources": [source(cluster, topic, **more)],
        }
    }
    return FleetService(parse_fleet_config(raw))


async def publish(
    cluster: MockCluster,
    topic: str,
    events: list[CloudEvent],
    mode: Literal["binary", "structured"] = "binary",
) -> None:
    """Through the sidecars' own Kafka sink."""
    servers = cluster.bootstrap.split(",")
    config = validate(
        kafka.Config, {"type": "kafka", "bootstrap_servers": servers, "topic": topic, "mode": mode}
    )
    sink = kafka.create(config, "kafka")
    try:
        for start in range(0, len(events), sink.max_batch):
            assert isinstance(await sink.publish(events[start : start + sink.max_batch]), Ok)
    finally:
        await sink.close(5.0)


def produce_raw(cluster: MockCluster, topic: str, messages: list[tuple[Any, bytes]]) -> None:
    """Messages (headers, value) as a plain producer writes them, all under one key."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "log_level": 3})
    for headers, value in messages:
        producer.produce(topic, value, b"poison-vm", headers=headers)
    assert producer.flush(10) == 0


def committed_to_the_end(cluster: MockCluster, topic: str) -> bool:
    """The group's committed offset of every partition is that partition's end."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": GROUP, "log_level": 3})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        wanted = [TopicPartition(topic, p) for p in partitions]
        committed = {tp.partition: tp.offset for tp in consumer.committed(wanted, timeout=10)}
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p))[1] for p in partitions}
    finally:
        consumer.close()
    return all(committed[p] == end for p, end in ends.items() if end > 0)


async def stored(service: FleetService, count: int, timeout: float = 60.0) -> None:
    async def reached() -> bool:
        return (await service.store.counts())["events"] >= count

    await eventually(reached, timeout=timeout)


async def audit_log(service: FleetService) -> dict[str, dict[str, Any]]:
    page = await service.store.events(EventQuery(limit=10_000))
    return {json.loads(row[3])["id"]: json.loads(row[3]) for row in page.rows}


def as_stored(events: list[CloudEvent]) -> dict[str, dict[str, Any]]:
    """What the audit log holds of `events`: each with its partitionkey (its VM)."""
    found = {}
    for event in events:
        body = json.loads(serialize(event))
        found[body["id"]] = {**body, "partitionkey": event.get_source()}
    return found


# --- configuration ------------------------------------------------------------------------


def test_the_connection_keys_are_the_sinks_and_offsets_are_never_auto_committed() -> None:
    config = validate(
        KafkaSourceConfig,
        {"type": "kafka", "preset": "eventhubs", "connection_string": EVENTHUBS_CONNECTION},
    )
    settings = config.consumer_settings()
    assert settings["bootstrap.servers"] == "fleet-ns.servicebus.windows.net:9093"
    assert settings["sasl.username"] == "$ConnectionString"
    assert settings["security.protocol"] == "SASL_SSL"
    assert settings["enable.auto.commit"] is False
    assert settings["group.id"] == "maintenance-fleet"
    assert "enable.idempotence" not in settings  # the producer's own settings stay out
    assert "request.timeout.ms" not in settings  # producer-only: a consumer would warn
    assert settings["metadata.max.age.ms"] == 180000  # Event Hubs' idle-connection rules stay
    assert "SharedAccessKey" not in repr(config)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"bootstrap_servers": ["k:9092"]}, "fleet.sources[0].topic: required"),
        ({"topic": "t"}, "fleet.sources[0].bootstrap_servers: required"),
        (
            {"bootstrap_servers": ["k:9092"], "topic": "t", "options": {"enable.auto.commit": 1}},
            "set by the source",
        ),
        (
            {"bootstrap_servers": ["k:9092"], "topic": "t", "sasl_mechanism": "PLAIN"},
            "needs username and password",
        ),
    ],
)
def test_configuration_mistakes_are_named(keys: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_fleet_config({"fleet": {"sources": [{"type": "kafka", **keys}]}})


def test_the_client_library_is_imported_only_when_the_source_starts() -> None:
    code = (
        "import sys; from bridge.fleet.config import parse_fleet_config;"
        "from bridge.fleet.service import FleetService;"
        "raw = {'fleet': {'store': {'url': 'sqlite:///tmp/unused.sqlite3'}, 'sources': ["
        "{'type': 'kafka', 'bootstrap_servers': ['k:9092'], 'topic': 't'}]}};"
        "FleetService(parse_fleet_config(raw));"
        "print('confluent_kafka' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


# --- against the mock cluster ---------------------------------------------------------------


async def test_both_binding_modes_arrive_and_offsets_follow_the_store(
    tmp_path: Path, cluster: MockCluster, topic: str
) -> None:
    events = fleet_events(per_vm=10)
    binary, structured = events[:15], events[15:]
    service = service_for(tmp_path, cluster, topic)
    async with service.running():
        await publish(cluster, topic, binary, mode="binary")
        await publish(cluster, topic, structured, mode="structured")
        await stored(service, len(events))
        logged = await audit_log(service)
        assert logged == as_stored(events)
        for body in logged.values():
            assert_valid(body)
        assert service.stats.counts[("kafka", "accepted")] == len(events)
        health = service.sources[0].health()
        assert health.ok, health.detail
        assert "partitions 0,1,2,3" in health.detail
    assert not service.sources[0].health().ok
    assert await asyncio.to_thread(committed_to_the_end, cluster, topic)


async def test_a_poison_message_is_rejected_and_committed_past(
    tmp_path: Path, cluster: MockCluster
) -> None:
    topic = cluster.create_topic(partitions=1)
    before, after = fleet_events(per_vm=1), fleet_events(per_vm=2)[3:]
    service = service_for(tmp_path, cluster, topic)
    async with service.running():
        await publish(cluster, topic, before)
        await asyncio.to_thread(
            produce_raw,
            cluster,
            topic,
            [
                (None, b"this is not json"),
                ([("ce_specversion", b"1.0"), ("content-type", b"application/json")], b"{}"),
                ([("content-type", b"text/plain")], b"hello"),
            ],
        )
        await publish(cluster, topic, after)
        await stored(service, len(before + after))
        assert (await service.store.counts())["rejected"] == 3
        reasons = [r["reason"] for r in await service.store.rejected()]
        assert all("CloudEvent" in reason for reason in reasons), reasons
        assert await audit_log(service) == as_stored(before + after)
    assert await asyncio.to_thread(committed_to_the_end, cluster, topic)


async def test_a_service_stopped_and_started_mid_stream_loses_and_doubles_nothing(
    tmp_path: Path, cluster: MockCluster, topic: str
) -> None:
    events = fleet_events(per_vm=60)
    await publish(cluster, topic, events[:90])
    first = service_for(tmp_path, cluster, topic, batch_size=10)
    async with first.running():
        await stored(first, 20)
        await publish(cluster, topic, events[90:])  # still streaming in as it stops
    second = service_for(tmp_path, cluster, topic, batch_size=10)
    async with second.running():
        await stored(second, len(events))
        assert await audit_log(second) == as_stored(events)
        assert (await second.store.counts())["events"] == len(events)
    assert await asyncio.to_thread(committed_to_the_end, cluster, topic)


async def test_a_fleet_process_killed_mid_stream_loses_and_doubles_nothing(
    tmp_path: Path, cluster: MockCluster, topic: str
) -> None:
    events = fleet_events(per_vm=200)
    url = f"sqlite://{tmp_path / 'fleet.sqlite3'}"
    config = tmp_path / "fleet.toml"
    table = {**source(cluster, topic), "batch_size": 5}
    options = table.pop("options")
    config.write_text(
        toml_table("[fleet.listener]", {"port": free_port()})
        + toml_table("[fleet.store]", {"url": url})
        + toml_table("[[fleet.sources]]", table)
        + toml_table("[fleet.sources.options]", {json.dumps(k): v for k, v in options.items()})
    )
    fleet = Process(["bridge", "fleet", "--config", str(config)], tmp_path / "fleet.log")
    store = build_store(url)
    await publish(cluster, topic, events)
    try:
        await fleet.start()
        await store_reached(url, 30)
        await fleet.kill()  # SIGKILL between store commits and offset commits
        killed_at = await stored_count(url)
        assert killed_at < len(events), "the kill came after the stream: nothing to prove"
        await fleet.start()
        await store_reached(url, len(events))
    finally:
        await fleet.stop()
    await store.open()
    try:
        assert (await store.counts())["events"] == len(events)
        page = await store.events(EventQuery(limit=10_000))
        assert {json.loads(row[3])["id"] for row in page.rows} == {e.get_id() for e in events}
    finally:
        await store.close()
    assert await asyncio.to_thread(committed_to_the_end, cluster, topic)


async def stored_count(url: str) -> int:
    """How many events the fleet store another process writes holds (-1: not created yet)."""
    store = build_store(url)
    try:
        await store.open()
        return (await store.counts())["events"]
    except Exception:
        return -1
    finally:
        await store.close()


async def store_reached(url: str, count: int) -> None:
    async def reached() -> bool:
        return await stored_count(url) >= count

    await eventually(reached, timeout=60)


async def test_a_second_replica_takes_partitions_over_and_nothing_is_lost_or_doubled(
    tmp_path: Path, cluster: MockCluster, topic: str
) -> None:
    events = fleet_events(per_vm=60)
    first = service_for(tmp_path, cluster, topic, batch_size=10)
    second = service_for(tmp_path, cluster, topic, batch_size=10)
    one, two = first.sources[0], second.sources[0]
    async with first.running():
        await publish(cluster, topic, events[:60])
        await stored(first, 30)
        async with second.running():
            # The group rebalances: each replica ends up with some of the four partitions.
            await eventually(lambda: took_part(two.health()), timeout=60)
            await eventually(lambda: took_part(one.health(), shared=True), timeout=60)
            await publish(cluster, topic, events[60:])
            await stored(first, len(events))
            assert await audit_log(first) == as_stored(events)
            accepted = [s.stats.counts[("kafka", "accepted")] for s in (first, second)]
            assert sum(accepted) == len(events)  # every event once
            assert all(s.stats.counts.get(("kafka", "duplicate"), 0) == 0 for s in (first, second))
            assert accepted[1] > 0  # the replica that joined took part
    assert await asyncio.to_thread(committed_to_the_end, cluster, topic)


def took_part(health: SourceHealth, shared: bool = False) -> bool:
    """Consuming some of the partitions (`shared`: not all four of them)."""
    if not health.ok or "partitions none" in health.detail:
        return False
    return not shared or "partitions 0,1,2,3" not in health.detail


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
async def test_events_out_of_the_stores_bounds_are_rejected_and_the_consumer_goes_on(
    tmp_path: Path, cluster: MockCluster, store: str, request: pytest.FixtureRequest
) -> None:
    """Issue #29: an integer past 2^63, a time past year 9999 in UTC, JSON 100,000 deep, a
    body not UTF-8: each is one rejected message, and the partition is committed past it."""
    from datetime import UTC, datetime

    from tests.fleet.poison import nested, poison

    topic = cluster.create_topic(partitions=1)
    before, after = fleet_events(per_vm=1), fleet_events(per_vm=2)[3:]
    service = service_for(tmp_path, cluster, topic)
    if store == "postgresql":
        service = FleetService(
            service.config, store=build_store(request.getfixturevalue("postgres_url"))
        )
    bad = [*poison(datetime.now(UTC)).values(), nested(100_000)]
    structured = [("content-type", b"application/cloudevents+json")]
    async with service.running():
        await publish(cluster, topic, before)
        await asyncio.to_thread(produce_raw, cluster, topic, [(structured, b) for b in bad])
        await publish(cluster, topic, after)
        await stored(service, len(before + after))
        await eventually(lambda: service.stats.counts[("kafka", "invalid")] == len(bad), timeout=30)
        assert (await service.store.counts())["rejected"] == len(bad)
        assert await audit_log(service) == as_stored(before + after)
        assert service.sources[0].health().ok
    assert await asyncio.to_thread(committed_to_the_end, cluster, topic)
