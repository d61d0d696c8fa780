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
secrets as literal, `env:VAR` or `file:PATH`, `options`) are the Kafka sink's: this Struct
extends `bridge.transports.kafka_connection.Connection`, as the sink's configuration does,
so the same checks, presets and librdkafka security settings (`connection_settings`) apply
to both, written once. Only the consumer's own keys are declared here: `group_id`, `start`,
and the batching, backoff and `identity` every bus source takes
(`bridge.fleet.bus_config._BusSource`, which a Struct with fields of its own cannot also inherit).

A plain Struct, no SDK: confluent-kafka is imported when the service starts the source.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec

from bridge.fleet.bus_config import _BusSource
from bridge.fleet.identity.config import IdentityMode
from bridge.infra.validation import FieldError
from bridge.transports.kafka_connection import Connection, connection_settings

#: librdkafka settings the source owns: offsets are committed only after the store commit.
CONSUMER_OPTIONS: Final = frozenset(
    {"group.id", "enable.auto.commit", "enable.auto.offset.store", "auto.offset.reset"}
)
_BUS_DEFAULTS: Final = _BusSource()


class KafkaSourceConfig(Connection, frozen=True, kw_only=True):
    """`type = "kafka"`: one consumer group on one topic (bridge/fleet/sources/kafka.py)."""

    type: Literal["kafka"] = "kafka"
    name: str = "kafka"
    #: The consumer group: replicas of the fleet service share it and split the partitions.
    group_id: str = "maintenance-fleet"
    #: Where a partition without a committed offset starts: its oldest message, or new ones.
    start: Literal["earliest", "latest"] = "earliest"
    #: As every bus source (see `_BusSource`).
    batch_size: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = _BUS_DEFAULTS.batch_size
    batch_wait: Annotated[float, msgspec.Meta(ge=0, le=60)] = _BUS_DEFAULTS.batch_wait
    retry_initial: Annotated[float, msgspec.Meta(gt=0)] = _BUS_DEFAULTS.retry_initial
    retry_max: Annotated[float, msgspec.Meta(gt=0)] = _BUS_DEFAULTS.retry_max
    identity: IdentityMode = _BUS_DEFAULTS.identity

    def __post_init__(self) -> None:
        for key in self.options:
            if key in CONSUMER_OPTIONS:
                raise FieldError(
                    "options", f"{key!r} is set by the source (offsets follow the store commit)"
                )
        super().__post_init__()

    def bus(self) -> _BusSource:
        """The batching and backoff keys, as the shared bus logic takes them."""
        return _BusSource(
            batch_size=self.batch_size,
            batch_wait=self.batch_wait,
            retry_initial=self.retry_initial,
            retry_max=self.retry_max,
            identity=self.identity,
        )

    def consumer_settings(self) -> dict[str, Any]:
        """librdkafka's consumer settings, secrets included: build the consumer, then drop it."""
        settings = connection_settings(self)
        settings.update(
            {
                "group.id": self.group_id,
                "enable.auto.commit": False,
                "auto.offset.reset": self.start,
            }
        )
        return settings
