"""The Kafka sink against librdkafka's mock cluster (real producer, real consumer group).

Nothing is mocked: events go through `confluent-kafka` to a three-broker mock cluster and
are read back by a `Consumer`, decoded with `bridge.transports.kafka_binding` (as the fleet
source does) and validated against the published schema. Failures are real too: the brokers
go down and come back, a topic refuses writes, an event exceeds ``message.max.bytes``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from cloudevents.core.v1.event import CloudEvent

from bridge.config import ConfigError
from bridge.infra.validation import validate
from bridge.pipeline.dispatch import Dispatcher
from bridge.pipeline.events import as_dict
from bridge.pipeline.spool import Spool
from bridge.simulator import Simulator
from bridge.sinkapi import Ok, Reject, Retry, Sink
from bridge.transports.kafka_binding import STRUCTURED_CONTENT_TYPE, to_structured_json
from sinks import kafka
from tests.factories import fleet_events, instance, per_source, sample_events
from tests.sinks.contract import SinkContract, modules_loaded_by_validating
from tests.sinks.kafka_mock import MockCluster, Reader, require_library
from tests.support import assert_valid, eventually, free_port
from tests.test_delivery import rows
from tests.test_doctor import doctor, gce_source, line

BINARY_HEADERS = [
    "ce_specversion",
    "ce_id",
    "ce_source",
    "ce_type",
    "ce_subject",
    "ce_time",
    "content-type",
    "ce_dataschema",
    "ce_traceparent",
    "ce_partitionkey",
]
EVENTHUBS_CONNECTION = (
    "Endpoint=sb://fleet-ns.servicebus.windows.net/;SharedAccessKeyName=send;"
    "SharedAccessKey=c2VjcmV0LWtleQ==;EntityPath=maintenance"
)


def configured(**keys: Any) -> kafka.Config:
    return validate(kafka.Config, {"type": "kafka", **keys})


def make(cluster: MockCluster, topic: str, **options: Any) -> kafka.KafkaSink:
    config = configured(bootstrap_servers=cluster.bootstrap.split(","), topic=topic, **options)
    return kafka.create(config, "kafka")


def decoded(message: Any) -> dict[str, Any]:
    """A consumed message as the structured JSON object the schema validates."""
    body = to_structured_json(message.headers(), message.value(), message.key())
    return assert_valid(json.loads(body))


def expected(event: CloudEvent) -> dict[str, Any]:
    """What a consumer sees of `event`: itself plus the partitionkey extension (its VM)."""
    return {**as_dict(event), "partitionkey": event.get_source()}


# --- configuration, presets and lazy import -----------------------------------------------


def test_config_defaults_and_required_keys() -> None:
    config = configured(bootstrap_servers=["b1:9092"], topic="maint")
    assert (config.mode, config.timeout, config.compression) == ("binary", 30.0, "none")
    settings = kafka.client_config(config)
    assert settings["enable.idempotence"] is True
    assert settings["acks"] == "all"
    assert settings["security.protocol"] == "PLAINTEXT"
    assert settings["message.timeout.ms"] == 30000
    assert settings["partitioner"] == "murmur2_random"
    problems: dict[str, dict[str, Any]] = {
        "bootstrap_servers: required": {"topic": "t"},
        "topic: required": {"bootstrap_servers": ["b:9092"]},
        "is not host:port": {"bootstrap_servers": ["broker"], "topic": "t"},
        "'acks' is set by the sink": {
            "bootstrap_servers": ["b:9092"],
            "topic": "t",
            "options": {"acks": "1"},
        },
        "'ssl.keystore.password' is set by the sink": {
            "bootstrap_servers": ["b:9092"],
            "topic": "t",
            "options": {"ssl.keystore.password": "x"},
        },
        "needs username and password": {
            "bootstrap_servers": ["b:9092"],
            "topic": "t",
            "sasl_mechanism": "SCRAM-SHA-512",
        },
        "needs oauth_token_url": {
            "bootstrap_servers": ["b:9092"],
            "topic": "t",
            "sasl_mechanism": "OAUTHBEARER",
        },
        "mode: must be one of": {"bootstrap_servers": ["b:9092"], "topic": "t", "mode": "x"},
    }
    for message, keys in problems.items():
        with pytest.raises(ConfigError, match=message):
            configured(**keys)


def test_sasl_settings_take_secrets_from_env_and_never_show_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAFKA_PASSWORD", "s3cret-scram")
    config = configured(
        bootstrap_servers=["b1:9093", "b2:9093"],
        topic="maint",
        sasl_mechanism="SCRAM-SHA-256",
        username="bridge",
        password="env:KAFKA_PASSWORD",
        ca_file="/etc/ssl/kafka-ca.pem",
    )
    settings = kafka.client_config(config)
    assert settings["bootstrap.servers"] == "b1:9093,b2:9093"
    assert settings["security.protocol"] == "SASL_SSL"
    assert (settings["sasl.mechanism"], settings["sasl.username"]) == ("SCRAM-SHA-256", "bridge")
    assert settings["sasl.password"] == "s3cret-scram"
    assert settings["ssl.ca.location"] == "/etc/ssl/kafka-ca.pem"
    assert "s3cret-scram" not in repr(config)
    sink = kafka.create(config, "kafka")
    assert "s3cret-scram" not in repr(sink) + repr(vars(sink))


def test_oauthbearer_uses_the_oidc_client_credentials_grant() -> None:
    config = configured(
        bootstrap_servers=["b1:9093"],
        topic="maint",
        sasl_mechanism="OAUTHBEARER",
        oauth_token_url="https://idp.example/oauth2/token",
        oauth_client_id="bridge",
        oauth_client_secret="oidc-secret",
        oauth_scope="kafka",
    )
    settings = kafka.client_config(config)
    assert settings["sasl.oauthbearer.method"] == "oidc"
    assert settings["sasl.oauthbearer.client.secret"] == "oidc-secret"
    assert settings["sasl.oauthbearer.scope"] == "kafka"
    assert "oidc-secret" not in repr(config)


def test_eventhubs_preset() -> None:
    config = configured(preset="eventhubs", connection_string=EVENTHUBS_CONNECTION)
    assert config.target() == (["fleet-ns.servicebus.windows.net:9093"], "maintenance")
    settings = kafka.client_config(config)
    assert settings["security.protocol"] == "SASL_SSL"
    assert settings["sasl.mechanism"] == "PLAIN"
    assert settings["sasl.username"] == "$ConnectionString"
    assert settings["sasl.password"] == EVENTHUBS_CONNECTION
    assert settings["request.timeout.ms"] == 60000
    assert settings["metadata.max.age.ms"] < 240000
    assert settings["socket.keepalive.enable"] is True
    assert "SharedAccessKey=" not in repr(config)
    without_entity = EVENTHUBS_CONNECTION.rsplit(";", 1)[0]
    with pytest.raises(ConfigError, match="topic: required: the event hub"):
        configured(preset="eventhubs", connection_string=without_entity)
    named = configured(
        preset="eventhubs",
        connection_string=without_entity,
        topic="other",
        compression="gzip",
    )
    assert named.target()[1] == "other"
    for keys, message in (
        ({"compression": "zstd"}, "compression: Event Hubs accepts only none or gzip"),
        ({"username": "x"}, "username: set by preset"),
        ({"connection_string": "Endpoint=https://x/"}, "has no Endpoint=sb://"),
    ):
        with pytest.raises(ConfigError, match=message):
            configured(**{"preset": "eventhubs", "connection_string": EVENTHUBS_CONNECTION, **keys})


def test_confluent_cloud_preset() -> None:
    config = configured(
        preset="confluent-cloud",
        bootstrap_servers=["pkc-12345.europe-west1.gcp.confluent.cloud:9092"],
        topic="maint",
        username="APIKEY123",
        password="api-secret",
    )
    settings = kafka.client_config(config)
    assert (settings["security.protocol"], settings["sasl.mechanism"]) == ("SASL_SSL", "PLAIN")
    assert (settings["sasl.username"], settings["sasl.password"]) == ("APIKEY123", "api-secret")
    with pytest.raises(ConfigError, match="needs username"):
        configured(
            preset="confluent-cloud",
            bootstrap_servers=["pkc-1.confluent.cloud:9092"],
            topic="maint",
        )


def test_importing_the_sink_does_not_import_the_client_library() -> None:
    config = {"type": "kafka", "bootstrap_servers": ["b:9092"], "topic": "t"}
    assert modules_loaded_by_validating(config, "confluent_kafka") == []


def test_error_mapping() -> None:
    from confluent_kafka import KafkaError

    permanent = [
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError._AUTHENTICATION,
        KafkaError._UNKNOWN_TOPIC,
    ]
    transient = [
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.REQUEST_TIMED_OUT,
    ]
    for code in permanent:
        assert isinstance(kafka.classify(KafkaError(code), "t"), Reject), code
    for code in transient:
        assert isinstance(kafka.classify(KafkaError(code), "t"), Retry), code
    denied = kafka.classify(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), "maint")
    assert "grant WRITE" in denied.reason


# --- the shared contract -------------------------------------------------------------------


class TestKafkaContract(SinkContract):
    @pytest.fixture(autouse=True)
    def _cluster(self, kafka_cluster: MockCluster) -> None:
        self.cluster = kafka_cluster
        self.topic = kafka_cluster.create_topic()

    async def make_sink(self) -> Sink:
        return make(self.cluster, self.topic, timeout=3.0)

    async def received(self) -> list[dict[str, Any]]:
        reader = Reader(self.cluster, self.topic)
        try:
            messages = await asyncio.to_thread(reader.drain, 1.5)
        finally:
            await asyncio.to_thread(reader.close)
        return [decoded(m) for m in messages]

    async def make_transient_failure(self) -> None:
        self.cluster.down()

    async def make_permanent_failure(self) -> None:
        self.cluster.refuse_writes(self.topic)


# --- through the real producer, read back by a real consumer ------------------------------


@pytest.mark.parametrize("mode", ["binary", "structured"])
async def test_round_trip_is_valid_and_keeps_per_vm_order_across_a_burst(
    kafka_cluster: MockCluster, mode: str
) -> None:
    events = fleet_events(per_vm=40)
    topic = kafka_cluster.create_topic(partitions=4)
    sink = make(kafka_cluster, topic, mode=mode)
    try:
        # A burst in dispatcher-sized batches, then one event at a time: both keep VM order.
        for start in range(0, 90, sink.max_batch):
            assert isinstance(await sink.publish(events[start : min(start + 500, 90)]), Ok)
        for event in events[90:]:
            assert isinstance(await sink.publish([event]), Ok)
    finally:
        await sink.close(5.0)
    reader = Reader(kafka_cluster, topic)
    try:
        messages = await asyncio.to_thread(reader.read, len(events))
        assert await asyncio.to_thread(reader.drain, 0.5) == []
    finally:
        await asyncio.to_thread(reader.close)

    got = [decoded(m) for m in messages]
    assert sorted(json.dumps(e, sort_keys=True) for e in got) == sorted(
        json.dumps(expected(e), sort_keys=True) for e in events
    )
    assert per_source(got) == per_source([as_dict(e) for e in events])
    by_id = {e.get_id(): e for e in events}
    for message in messages:
        event = by_id[decoded(message)["id"]]
        assert message.key() == event.get_source().encode()
        headers = dict(message.headers())
        if mode == "binary":
            assert [name for name, _ in message.headers()] == BINARY_HEADERS
            assert headers["content-type"] == b"application/json"
            for name, value in expected(event).items():
                if name not in ("data", "datacontenttype"):
                    assert headers[f"ce_{name}"] == value.encode()
            assert json.loads(message.value()) == as_dict(event)["data"]
        else:
            assert headers == {"content-type": STRUCTURED_CONTENT_TYPE.encode()}
            assert json.loads(message.value()) == expected(event)
    # One VM, one partition: the key decides it, as with Java clients (murmur2).
    partitions: dict[str, set[int]] = {}
    for message in messages:
        partitions.setdefault(message.key().decode(), set()).add(message.partition())
    assert all(len(p) == 1 for p in partitions.values())


async def test_oversize_event_is_rejected_before_anything_is_sent(
    kafka_cluster: MockCluster,
) -> None:
    (event,) = sample_events(1, instance("vm-big"))
    big = CloudEvent({**event.get_attributes(), "comment": "x" * 5000}, event.get_data())
    topic = kafka_cluster.create_topic()
    sink = make(kafka_cluster, topic, message_max_bytes=4000)
    try:
        result = await sink.publish([*sample_events(2), big])
    finally:
        await sink.close(5.0)
    assert isinstance(result, Reject), result
    assert "larger than message_max_bytes 4000" in result.reason
    reader = Reader(kafka_cluster, topic)
    try:
        assert await asyncio.to_thread(reader.drain, 1.0) == []
    finally:
        await asyncio.to_thread(reader.close)


async def test_oversize_event_goes_to_the_dead_letters_and_the_rest_is_delivered(
    kafka_cluster: MockCluster, tmp_path: Path
) -> None:
    events = sample_events(4, instance("vm-a"))
    big = CloudEvent({**events[1].get_attributes(), "comment": "x" * 5000}, events[1].get_data())
    events[1] = big
    topic = kafka_cluster.create_topic()
    sink = make(kafka_cluster, topic, message_max_bytes=4000)
    spool = Spool(tmp_path, [sink.name])
    await spool.open()
    dispatcher = Dispatcher(spool, [sink], retry_initial=0.05, retry_max=0.5)
    dispatcher.start()
    reader = Reader(kafka_cluster, topic)
    try:
        await spool.commit(rows(events))
        dispatcher.notify()
        messages = await asyncio.to_thread(reader.read, 3)
        messages += await asyncio.to_thread(reader.drain, 0.5)
        letters = await spool.dead_letters(sink.name)
    finally:
        await dispatcher.stop(5.0)
        await spool.close()
        await asyncio.to_thread(reader.close)
    assert [decoded(m)["id"] for m in messages] == [e.get_id() for e in events if e is not big]
    assert [d.id for d in letters] == [big.get_id()]
    assert "message_max_bytes" in letters[0].reason


async def test_refused_topic_is_reject_and_healthcheck_says_so(
    kafka_cluster: MockCluster,
) -> None:
    topic = kafka_cluster.create_topic()
    sink = make(kafka_cluster, topic, timeout=5.0)
    try:
        health = await sink.healthcheck()
        assert health.ok, health.detail
        assert f"topic {topic} with 4 partition(s) on 3 broker(s)" in health.detail
        kafka_cluster.refuse_writes(topic)
        health = await sink.healthcheck()
        assert not health.ok
        assert "TOPIC_AUTHORIZATION_FAILED" in health.detail
    finally:
        await sink.close(5.0)


async def test_unreachable_bootstrap_is_retry_then_healthcheck_fails() -> None:
    require_library()
    config = configured(
        bootstrap_servers=[f"127.0.0.1:{free_port()}"],
        topic="maint",
        timeout=1.0,
    )
    sink = kafka.create(config, "kafka")
    try:
        result = await sink.publish(sample_events(1))
        assert isinstance(result, Retry), result
        assert "_MSG_TIMED_OUT" in result.reason
        health = await sink.healthcheck()
        assert not health.ok
        assert "no metadata from 127.0.0.1:" in health.detail
    finally:
        await sink.close(1.0)


async def test_brokers_down_and_back_through_dispatcher_and_spool_lose_nothing(
    kafka_cluster: MockCluster, tmp_path: Path
) -> None:
    """Every broker goes away mid-run and comes back: Retry meanwhile, then all arrive."""
    events = fleet_events(per_vm=6)
    before, during = events[:6], events[6:]
    topic = kafka_cluster.create_topic()
    sink = make(kafka_cluster, topic, timeout=1.5)
    spool = Spool(tmp_path, [sink.name])
    await spool.open()
    dispatcher = Dispatcher(spool, [sink], retry_initial=0.05, retry_max=0.5)
    dispatcher.start()
    stats = dispatcher.stats[sink.name]
    reader = Reader(kafka_cluster, topic)
    try:
        await spool.commit(rows(before))
        dispatcher.notify()
        first = await asyncio.to_thread(reader.read, len(before))
        kafka_cluster.down()
        await spool.commit(rows(during))
        dispatcher.notify()
        await eventually(lambda: stats.retried >= 2, timeout=30.0)
        assert stats.delivered == len(before)
        assert stats.last_error is not None
        assert "_MSG_TIMED_OUT" in stats.last_error
        kafka_cluster.up()
        rest = await asyncio.to_thread(reader.read, len(during), 60.0)
        await eventually(lambda: stats.delivered == len(events), timeout=30.0)
        extra = await asyncio.to_thread(reader.drain, 0.5)
    finally:
        await dispatcher.stop(5.0)
        await spool.close()
        await asyncio.to_thread(reader.close)

    assert stats.dead_lettered == 0
    got = [decoded(m) for m in [*first, *rest, *extra]]
    # At-least-once: a batch may be sent again after a failed attempt, never lost or reordered.
    assert sorted(dict.fromkeys(e["id"] for e in got)) == sorted(e.get_id() for e in events)
    first_seen = [json.loads(s) for s in dict.fromkeys(json.dumps(e) for e in got)]
    assert per_source(first_seen) == per_source([as_dict(e) for e in events])


async def test_doctor_checks_the_topic_and_produces_a_test_event(
    kafka_cluster: MockCluster, gce_sim: Simulator, tmp_path: Path
) -> None:
    topic = kafka_cluster.create_topic()
    servers = ", ".join(f'"{s}"' for s in kafka_cluster.bootstrap.split(","))
    config = tmp_path / "bridge.toml"
    config.write_text(
        f"""{gce_source(gce_sim)}
[state]
dir = "{tmp_path / "state"}"
[listener]
port = 0
[[sinks]]
type = "kafka"
bootstrap_servers = [{servers}]
topic = "{topic}"
"""
    )
    code, output = await doctor(config, "--send-test-event")
    assert code == 0, output
    assert f"topic {topic} with 4 partition(s)" in output
    assert "accepted io.maintenancebridge.test" in line(output, "sink kafka test event")
    reader = Reader(kafka_cluster, topic)
    try:
        (message,) = await asyncio.to_thread(reader.read, 1)
    finally:
        await asyncio.to_thread(reader.close)
    assert decoded(message)["type"] == "io.maintenancebridge.test"

    kafka_cluster.refuse_writes(topic)
    code, output = await doctor(config)
    assert code == 1
    assert f"topic {topic}: TOPIC_AUTHORIZATION_FAILED" in output


async def test_failed_authentication_is_reject_with_the_reason(kafka_cluster: MockCluster) -> None:
    """The mock brokers speak no SASL: librdkafka fails the handshake as _AUTHENTICATION and
    the messages time out; the sink reports the authentication failure, not a timeout."""
    topic = kafka_cluster.create_topic()
    sink = make(
        kafka_cluster,
        topic,
        timeout=2.0,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        username="bridge",
        password="wrong-password",
    )
    try:
        result = await sink.publish(sample_events(1))
    finally:
        await sink.close(1.0)
    assert isinstance(result, Reject), result
    assert "_AUTHENTICATION" in result.reason
    assert "check the credentials" in result.reason
    assert "wrong-password" not in result.reason
