"""The configuration of `[[fleet.sources]] type = "kafka"` (registered in
`bridge.fleet.config.SOURCE_TYPES`).

```toml
[[fleet.sources]]
type = "kafka"
bootstrap_servers = ["kafka-1:9092"]
topic = "maintenance-events"
group_id = "maintenance-fleet"
```

The connection keys (brokers, topic, `preset = "eventhubs" | "confluent-cloud"`, SASL, TLS,
secrets as literal, `env:VAR` or `file:PATH`) are the Kafka sink's, with the same names:
the source builds a `sinks.kafka.Config` of them, so the sink's checks, presets and
librdkafka security settings are the ones that apply, written once. Only the consumer's own
keys (`group_id`, `start`, the batching of `_BusSource`) are declared here.

A plain Struct, no SDK: confluent-kafka is imported when the service starts the source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from bridge.fleet.bus_config import _BusSource
from bridge.secrets import Secret
from bridge.validation import FieldError
from sinks.kafka import Config as ConnectionConfig
from sinks.kafka import Mechanism, Protocol, client_config

#: librdkafka settings the source owns: offsets are committed only after the store commit.
CONSUMER_OPTIONS: Final = frozenset(
    {"group.id", "enable.auto.commit", "enable.auto.offset.store", "auto.offset.reset"}
)
#: What `sinks.kafka.client_config` sets for a producer only; a consumer leaves them out.
PRODUCER_SETTINGS: Final = frozenset(
    {
        "enable.idempotence",
        "acks",
        "message.timeout.ms",
        "message.max.bytes",
        "linger.ms",
        "compression.codec",
        "partitioner",
        "request.timeout.ms",  # producer-only in librdkafka (the Event Hubs preset sets it)
    }
)
#: The keys handed to the sink's `Config` as they are.
CONNECTION_KEYS: Final = (
    "bootstrap_servers",
    "topic",
    "preset",
    "security_protocol",
    "sasl_mechanism",
    "username",
    "password",
    "connection_string",
    "ca_file",
    "oauth_token_url",
    "oauth_client_id",
    "oauth_client_secret",
    "oauth_scope",
)


class KafkaSourceConfig(_BusSource, frozen=True, kw_only=True):
    """`type = "kafka"`: one consumer group on one topic (bridge/fleet/sources/kafka.py)."""

    type: Literal["kafka"] = "kafka"
    name: str = "kafka"
    bootstrap_servers: list[str] | None = None
    topic: str | None = None
    preset: Literal["eventhubs", "confluent-cloud"] | None = None
    security_protocol: Protocol | None = None
    sasl_mechanism: Mechanism | None = None
    username: str | None = None
    password: Secret | None = None
    connection_string: Secret | None = None
    ca_file: Path | None = None
    oauth_token_url: str | None = None
    oauth_client_id: str | None = None
    oauth_client_secret: Secret | None = None
    oauth_scope: str | None = None
    #: The consumer group: replicas of the fleet service share it and split the partitions.
    group_id: str = "maintenance-fleet"
    #: Where a partition without a committed offset starts: its oldest message, or new ones.
    start: Literal["earliest", "latest"] = "earliest"
    #: Further librdkafka consumer settings (not the sink's managed ones, nor CONSUMER_OPTIONS).
    options: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in self.options:
            if key in CONSUMER_OPTIONS:
                raise FieldError(
                    "options", f"{key!r} is set by the source (offsets follow the store commit)"
                )
        self.connection()  # the sink's checks, raising FieldError/ValueError as it does

    def connection(self) -> ConnectionConfig:
        """The connection keys as the Kafka sink's configuration (checked by it)."""
        keys = {key: getattr(self, key) for key in CONNECTION_KEYS}
        return ConnectionConfig(type="kafka", options=dict(self.options), **keys)

    def consumer_settings(self) -> dict[str, Any]:
        """librdkafka's consumer settings, secrets included: build the consumer, then drop it."""
        settings = {
            key: value
            for key, value in client_config(self.connection()).items()
            if key not in PRODUCER_SETTINGS or key in self.options
        }
        settings.update(
            {
                "group.id": self.group_id,
                "enable.auto.commit": False,
                "auto.offset.reset": self.start,
            }
        )
        return settings
