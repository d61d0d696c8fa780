"""Publishes events to a Kafka topic per the CloudEvents Kafka binding (also Event Hubs' Kafka).

The message layout (binary or structured mode, key = the VM's ``partitionkey``) lives in
`bridge.transports.kafka_binding`, and the connection keys (brokers, presets, SASL, TLS) in
`bridge.transports.kafka_connection`, both shared with the fleet's source that reads the
topic back.

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

Instance identity: with `[identity]` configured, every message carries the sidecar's
credential as the header ``bridgecredential`` (both modes;
`bridge.transports.kafka_binding`), which the fleet's `kafka` source screens. A bus cannot
answer 401, so the sink never learns of a refusal: the credential is renewed before it
expires, not on a refusal.

``confluent_kafka`` (librdkafka) is imported only when a sink is built, and the producer is
created at the first publish; its log lines go to the ``sinks.kafka`` logger, never with
the configured secrets, which are handed to librdkafka only when the producer is built.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

import msgspec
from cloudevents.core.v1.event import CloudEvent

from bridge.sinkapi import (
    CredentialSource,
    FieldError,
    Health,
    Ok,
    Reject,
    Result,
    Retry,
    Sink,
    instance_credential,
)
from bridge.transports.kafka_binding import Record, to_record
from bridge.transports.kafka_connection import Connection, connection_settings

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Producer

log = logging.getLogger("sinks.kafka")

#: Event Hubs' recommended producer request timeout; a producer-only property (a consumer
#: given it logs a configuration warning), so it is set for the sink, not the fleet's source.
EVENTHUBS_PRODUCER_OPTIONS: Final[dict[str, str | int | bool]] = {"request.timeout.ms": 60000}
#: Bytes librdkafka counts per message besides key, value and headers (record overhead).
RECORD_OVERHEAD: Final = 64


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
    #: The sidecar's credential (`[identity]`), set by the runner; None: none is sent.
    enrollment: CredentialSource | None = None

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

    def _encode(
        self, batch: Sequence[CloudEvent], credential: str | None = None
    ) -> list[Record] | Reject:
        records = []
        limit = self._config.message_max_bytes
        for event in batch:
            record = to_record(event, self.mode, credential)
            if (size := record_size(record)) > limit:
                return Reject(
                    f"event {event.get_id()} from {event.get_source()} is {size} bytes, larger "
                    f"than message_max_bytes {limit} of topic {self.topic}"
                )
            records.append(record)
        return records

    async def _publish(self, batch: Sequence[CloudEvent]) -> Result:
        credential = await instance_credential(self.enrollment)
        if isinstance(credential, Retry):
            return credential
        records = self._encode(batch, credential)
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
