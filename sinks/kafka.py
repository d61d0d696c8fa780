"""Publishes events to a Kafka topic per the CloudEvents Kafka binding (also Event Hubs' Kafka).

The message layout (binary or structured mode, key = the VM's ``partitionkey``) lives in
`sinks.kafka_binding`, shared with whatever reads the topic back.

Delivery: an idempotent producer (``enable.idempotence``, ``acks=all``), so the broker
de-duplicates the client's own resends and keeps each partition in order. A batch is `Ok`
only when every message's delivery report said so. ``message.timeout.ms`` is the sink's
``timeout``: librdkafka gives up on a message by then and reports it, so each `publish` is
one bounded attempt and the dispatcher (backoff, spool, dead letters) owns the retries.
Reports with transient errors (broker down, leader moving, timeouts) give `Retry`; an
event larger than ``message.max.bytes`` and authorization or authentication failures give
`Reject`. The key is murmur2-hashed like the Java client (``partitioner=murmur2_random``),
so every client of the topic agrees on a VM's partition.

A failed batch is sent again whole: delivery is at least once, consumers de-duplicate on
``source`` + ``id`` (as for every sink). An event too large is found before anything of its
batch is produced, so a rejected batch sends nothing twice.

``confluent_kafka`` (librdkafka) is imported only when a sink is built, and the producer is
created at the first publish; its log lines go to the ``sinks.kafka`` logger, never with
the configured secrets, which are handed to librdkafka only when the producer is built.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

import msgspec
from cloudevents.core.v1.event import CloudEvent

from bridge.sinkapi import FieldError, Health, Ok, Reject, Result, Retry, Secret, Sink, SinkConfig
from sinks.kafka_binding import Record, to_record

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Producer

log = logging.getLogger("sinks.kafka")

#: Event Hubs' Kafka endpoint: the namespace host on port 9093, SASL PLAIN over TLS with the
#: literal user ``$ConnectionString``; it drops idle connections after 240 s, so metadata
#: is refreshed and idle connections closed before that. Only gzip compression is accepted.
EVENTHUBS_PORT: Final = 9093
EVENTHUBS_USER: Final = "$ConnectionString"
EVENTHUBS_OPTIONS: Final[dict[str, str | int | bool]] = {
    "metadata.max.age.ms": 180000,
    "connections.max.idle.ms": 180000,
    "socket.keepalive.enable": True,
}
#: Event Hubs' recommended producer request timeout; a producer-only property (a consumer
#: given it logs a configuration warning), so it is set for the sink, not the fleet's source.
EVENTHUBS_PRODUCER_OPTIONS: Final[dict[str, str | int | bool]] = {"request.timeout.ms": 60000}
#: Bytes librdkafka counts per message besides key, value and headers (record overhead).
RECORD_OVERHEAD: Final = 64
#: librdkafka settings the sink owns: delivery guarantees and secrets have their own keys.
MANAGED_OPTIONS: Final = frozenset(
    {
        "bootstrap.servers",
        "enable.idempotence",
        "acks",
        "message.timeout.ms",
        "delivery.timeout.ms",
        "message.max.bytes",
        "security.protocol",
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
        "sasl.oauthbearer.client.secret",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.key.pem",
    }
)
_EVENTHUBS_ENDPOINT: Final = re.compile(r"(?:^|;)\s*Endpoint\s*=\s*sb://([^/;:]+)", re.IGNORECASE)
_ENTITY_PATH: Final = re.compile(r"(?:^|;)\s*EntityPath\s*=\s*([^;]+)", re.IGNORECASE)

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
Mechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]


class Connection(SinkConfig, frozen=True, kw_only=True):
    """How to reach a topic: brokers, presets, SASL, TLS; the keys the sink and the fleet's
    `kafka` source (`bridge.fleet.kafka_config`) share, with one set of checks."""

    type: str = "kafka"
    #: ``host:port`` of one or more brokers; derived from the connection string for Event Hubs.
    bootstrap_servers: list[str] | None = None
    #: The topic (for Event Hubs: the event hub; defaults to the connection string's EntityPath).
    topic: str | None = None
    preset: Literal["eventhubs", "confluent-cloud"] | None = None
    #: Default PLAINTEXT, or SASL_SSL with a preset or a SASL mechanism.
    security_protocol: Protocol | None = None
    sasl_mechanism: Mechanism | None = None
    username: str | None = None
    password: Secret | None = None
    #: Event Hubs preset: the namespace (or hub) connection string, as the SASL password.
    connection_string: Secret | None = None
    #: PEM file of the CAs that sign the brokers' certificates (default: the system's).
    ca_file: Path | None = None
    #: OAUTHBEARER through an OIDC client-credentials grant.
    oauth_token_url: str | None = None
    oauth_client_id: str | None = None
    oauth_client_secret: Secret | None = None
    oauth_scope: str | None = None
    #: Further librdkafka settings (not those listed in MANAGED_OPTIONS).
    options: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in self.options:
            if key in MANAGED_OPTIONS or key.endswith((".password", ".secret")):
                raise FieldError(
                    "options",
                    f"{key!r} is set by the sink: use its own keys (bootstrap_servers, "
                    "username/password, ...); delivery guarantees cannot be turned off",
                )
        if self.preset == "eventhubs":
            self._check_eventhubs()
        elif self.preset == "confluent-cloud" and (self.username is None or self.password is None):
            raise ValueError(
                "preset confluent-cloud needs username (the API key) and password "
                "(the API secret, e.g. env:CONFLUENT_API_SECRET)"
            )
        if self.preset != "eventhubs":
            if not self.bootstrap_servers:
                raise FieldError("bootstrap_servers", "required: one or more host:port")
            if self.topic is None:
                raise FieldError("topic", "required")
            if self.connection_string is not None:
                raise FieldError("connection_string", 'only with preset = "eventhubs"')
        for server in self.bootstrap_servers or []:
            host, _, port = server.rpartition(":")
            if not host or not port.isdigit():
                raise FieldError("bootstrap_servers", f"{server!r} is not host:port")
        self._check_security()

    def _check_eventhubs(self) -> None:
        if self.connection_string is None:
            raise FieldError("connection_string", 'required with preset = "eventhubs"')
        text = self.connection_string.get_secret_value()
        if not _EVENTHUBS_ENDPOINT.search(text):
            raise FieldError(
                "connection_string", "has no Endpoint=sb://<namespace>.servicebus.windows.net/"
            )
        if self.topic is None and not _ENTITY_PATH.search(text):
            raise FieldError(
                "topic", "required: the event hub (the connection string has no EntityPath)"
            )
        for key in ("username", "password", "sasl_mechanism", "security_protocol"):
            if getattr(self, key) is not None:
                raise FieldError(key, 'set by preset = "eventhubs" (from the connection string)')

    def _check_security(self) -> None:
        mechanism = self.sasl_mechanism
        if self.security_protocol in ("PLAINTEXT", "SSL") and mechanism is not None:
            raise FieldError("sasl_mechanism", "needs a SASL_* security_protocol")
        if mechanism == "OAUTHBEARER":
            if not (self.oauth_token_url and self.oauth_client_id and self.oauth_client_secret):
                raise ValueError(
                    "sasl_mechanism OAUTHBEARER needs oauth_token_url, oauth_client_id and "
                    "oauth_client_secret"
                )
        elif mechanism is not None and (self.username is None or self.password is None):
            raise ValueError(f"sasl_mechanism {mechanism} needs username and password")

    def target(self) -> tuple[list[str], str]:
        """The bootstrap servers and the topic, presets resolved."""
        if self.preset == "eventhubs":
            assert self.connection_string is not None
            text = self.connection_string.get_secret_value()
            endpoint = _EVENTHUBS_ENDPOINT.search(text)
            assert endpoint is not None
            entity = _ENTITY_PATH.search(text)
            topic = self.topic or (entity.group(1).strip() if entity else "")
            return [f"{endpoint.group(1)}:{EVENTHUBS_PORT}"], topic
        assert self.bootstrap_servers is not None
        assert self.topic is not None
        return list(self.bootstrap_servers), self.topic


class Config(Connection, frozen=True, kw_only=True):
    """`[[sinks]] type = "kafka"`: brokers + topic, or a preset (see docs/kafka.md)."""

    type: Literal["kafka"] = "kafka"
    mode: Literal["binary", "structured"] = "binary"
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "none"
    #: The broker's (or topic's) limit; a larger event is rejected to the dead letters.
    message_max_bytes: Annotated[int, msgspec.Meta(ge=1000, le=1_000_000_000)] = 1_000_000
    linger_ms: Annotated[float, msgspec.Meta(ge=0, le=900_000)] = 5.0
    #: Deadline of one publish attempt, in seconds (librdkafka's ``message.timeout.ms``).
    timeout: Annotated[float, msgspec.Meta(gt=0)] = 30.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.preset == "eventhubs" and self.compression not in ("none", "gzip"):
            raise FieldError("compression", "Event Hubs accepts only none or gzip")


def connection_settings(config: Connection) -> dict[str, Any]:
    """librdkafka's settings to reach the brokers (a producer's or a consumer's), secrets
    included: build the client, then drop them."""
    servers, _ = config.target()
    settings: dict[str, Any] = {"bootstrap.servers": ",".join(servers)}
    if config.preset == "eventhubs":
        assert config.connection_string is not None
        settings.update(EVENTHUBS_OPTIONS)
        settings.update(
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "PLAIN",
                "sasl.username": EVENTHUBS_USER,
                "sasl.password": config.connection_string.get_secret_value(),
            }
        )
    else:
        mechanism = config.sasl_mechanism or ("PLAIN" if config.preset else None)
        protocol = config.security_protocol or ("SASL_SSL" if mechanism else "PLAINTEXT")
        settings["security.protocol"] = protocol
        if mechanism is not None:
            settings["sasl.mechanism"] = mechanism
        if mechanism == "OAUTHBEARER":
            assert config.oauth_client_secret is not None
            settings.update(
                {
                    "sasl.oauthbearer.method": "oidc",
                    "sasl.oauthbearer.token.endpoint.url": config.oauth_token_url,
                    "sasl.oauthbearer.client.id": config.oauth_client_id,
                    "sasl.oauthbearer.client.secret": config.oauth_client_secret.get_secret_value(),
                }
            )
            if config.oauth_scope:
                settings["sasl.oauthbearer.scope"] = config.oauth_scope
        elif mechanism is not None:
            assert config.password is not None
            settings["sasl.username"] = config.username
            settings["sasl.password"] = config.password.get_secret_value()
    if config.ca_file is not None:
        settings["ssl.ca.location"] = str(config.ca_file)
    settings.update(config.options)
    return settings


def client_config(config: Config) -> dict[str, Any]:
    """librdkafka's producer settings for `config`, secrets included: build the producer,
    then drop it."""
    settings: dict[str, Any] = {
        "enable.idempotence": True,
        "acks": "all",
        "message.timeout.ms": max(1, round(config.timeout * 1000)),
        "message.max.bytes": config.message_max_bytes,
        "linger.ms": config.linger_ms,
        "compression.codec": config.compression,
        "partitioner": "murmur2_random",
    }
    if config.preset == "eventhubs":
        settings.update(EVENTHUBS_PRODUCER_OPTIONS)
    settings.update(connection_settings(config))  # ends with the user's `options`
    return settings


#: Error codes no retry can fix (by name, so this module loads without confluent_kafka).
PERMANENT_ERRORS: Final = {
    "MSG_SIZE_TOO_LARGE": "larger than the broker's message.max.bytes",
    "RECORD_LIST_TOO_LARGE": "larger than the broker accepts",
    "INVALID_RECORD": "refused by the broker as invalid",
    "INVALID_TOPIC_EXCEPTION": "the topic name is invalid",
    "_UNKNOWN_TOPIC": "the topic does not exist (create it or fix `topic`)",
    "TOPIC_AUTHORIZATION_FAILED": "not authorized to write to the topic (grant WRITE on it)",
    "CLUSTER_AUTHORIZATION_FAILED": (
        "not authorized on the cluster (the idempotent producer needs IDEMPOTENT_WRITE)"
    ),
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": "not authorized for the producer id",
    "SASL_AUTHENTICATION_FAILED": "authentication failed (check username/password)",
    "_AUTHENTICATION": "authentication failed (check the credentials and the CA)",
    "_SSL": "the TLS handshake failed (check ca_file and the broker's certificate)",
}


def classify(error: KafkaError, topic: str) -> Retry | Reject:
    """Map a delivery error to Retry or Reject (anything not known to be permanent retries)."""
    name = error.name()
    reason = f"producing to {topic}: {name}: {error.str()}"
    if name in PERMANENT_ERRORS:
        return Reject(f"{reason}; {PERMANENT_ERRORS[name]}")
    return Retry(reason)


def record_size(record: Record) -> int:
    """What librdkafka compares with message.max.bytes, closely enough to decide up front."""
    headers = sum(len(name) + len(value) for name, value in record.headers)
    return len(record.key) + len(record.value) + headers + RECORD_OVERHEAD


class KafkaSink(Sink):
    """One idempotent `confluent_kafka.Producer`, created at the first publish."""

    max_batch = 500

    def __init__(self, name: str, config: Config) -> None:
        super().__init__(name)
        try:
            import confluent_kafka
        except ModuleNotFoundError as exc:
            raise RuntimeError(
                "the kafka sink needs confluent-kafka: pip install 'maintenance-bridge[kafka]'"
            ) from exc

        self._kafka = confluent_kafka
        self._config = config
        self.servers, self.topic = config.target()
        self.mode = config.mode
        self.timeout = config.timeout
        self._producer: Producer | None = None
        #: The last client-wide error (authentication, all brokers down) since the last
        #: delivery that went through: it explains why messages timed out.
        self._client_error: KafkaError | None = None

    def _get_producer(self) -> Producer:
        if self._producer is None:
            self._producer = self._kafka.Producer(
                client_config(self._config), logger=log, error_cb=self._on_client_error
            )
        return self._producer

    def _on_client_error(self, error: KafkaError) -> None:
        """librdkafka's error callback (runs inside flush): remember it for `_timed_out`."""
        self._client_error = error
        log.debug("kafka sink %s: %s: %s", self.name, error.name(), error.str())

    def _encode(self, batch: Sequence[CloudEvent]) -> list[Record] | Reject:
        records = []
        limit = self._config.message_max_bytes
        for event in batch:
            record = to_record(event, self.mode)
            if (size := record_size(record)) > limit:
                return Reject(
                    f"event {event.get_id()} from {event.get_source()} is {size} bytes, larger "
                    f"than message_max_bytes {limit} of topic {self.topic}"
                )
            records.append(record)
        return records

    async def _publish(self, batch: Sequence[CloudEvent]) -> Result:
        records = self._encode(batch)
        if isinstance(records, Reject):
            return records
        producer = self._get_producer()
        reports: list[KafkaError | None] = []
        failure: Result | None = None
        for record in records:
            headers: list[tuple[str, str | bytes | None]] = [*record.headers]
            try:
                producer.produce(
                    self.topic,
                    record.value,
                    record.key,
                    headers=headers,
                    on_delivery=lambda error, _message: reports.append(error),
                )
            except BufferError:
                failure = Retry(f"the producer's queue for {self.topic} is full")
                break
            except self._kafka.KafkaException as exc:
                failure = classify(exc.args[0], self.topic)
                break
        # flush() serves the delivery reports; message.timeout.ms bounds it, plus a margin.
        left = await asyncio.to_thread(producer.flush, self.timeout + 5.0)
        outcome = failure or self._outcome(reports, left)
        if isinstance(outcome, Retry) and self._is_fatal():
            await self._reset_producer()
        return outcome

    def _outcome(self, reports: list[KafkaError | None], left: int) -> Result:
        worst: Result = Ok()
        if any(error is None for error in reports):
            self._client_error = None  # a delivery went through: older client errors are over
        for error in reports:
            if error is None:
                continue
            outcome: Result = classify(error, self.topic)
            if isinstance(outcome, Retry) and error.code() == self._kafka.KafkaError._MSG_TIMED_OUT:
                outcome = self._timed_out(outcome)
            if isinstance(outcome, Reject) or isinstance(worst, Ok):
                worst = outcome
        if isinstance(worst, Ok) and left:
            return Retry(f"{left} message(s) to {self.topic} still undelivered after the deadline")
        return worst

    def _timed_out(self, outcome: Retry) -> Retry | Reject:
        """A message that timed out because authentication fails is a Reject, else a Retry."""
        error = self._client_error
        if error is None:
            return outcome
        if error.name() in PERMANENT_ERRORS:
            return classify(error, self.topic)
        return Retry(f"{outcome.reason} (last client error {error.name()}: {error.str()})")

    def _is_fatal(self) -> bool:
        return self._client_error is not None and self._client_error.fatal()

    async def _reset_producer(self) -> None:
        """A fatal error (idempotence state lost) makes the producer unusable: build anew."""
        old, self._producer, self._client_error = self._producer, None, None
        if old is not None:
            await asyncio.to_thread(old.flush, 0)

    async def healthcheck(self) -> Health:
        """A metadata request: the cluster answers, the topic exists and is not forbidden."""
        producer = self._get_producer()
        try:
            metadata = await asyncio.to_thread(
                producer.list_topics, self.topic, min(self.timeout, 10.0)
            )
        except self._kafka.KafkaException as exc:
            return Health(False, f"no metadata from {','.join(self.servers)}: {exc.args[0].str()}")
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None:
            error = topic.error if topic is not None else None
            detail = f"{error.name()}: {error.str()}" if error is not None else "not in metadata"
            return Health(False, f"topic {self.topic}: {detail}")
        return Health(
            True,
            f"topic {self.topic} with {len(topic.partitions)} partition(s) on "
            f"{len(metadata.brokers)} broker(s) of cluster {metadata.cluster_id}",
        )

    async def flush(self, timeout: float) -> None:
        if self._producer is not None:
            await asyncio.to_thread(self._producer.flush, timeout)

    async def _close(self, timeout: float) -> None:
        """Deliver what librdkafka still holds within `timeout`; the producer goes with GC."""
        await self.flush(timeout)
        self._producer = None

    def __repr__(self) -> str:
        return f"<KafkaSink {self.name!r} topic={self.topic} mode={self.mode}>"


def create(config: Config, name: str) -> KafkaSink:
    return KafkaSink(name, config)
