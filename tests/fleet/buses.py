"""The buses the fleet's end-to-end tests run through, each with a sink the sidecars publish
with and a source the fleet consumes with: the Pub/Sub emulator, the Event Hubs test server
and librdkafka's mock cluster (real servers and client libraries; skipped without them,
failing under CI=true). The `bus` fixture is in `tests.fleet.bus_fixture`, a plugin a test
module names in `pytest_plugins`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tests.sinks.eventhub_server import EventHubServer
from tests.sinks.kafka_mock import MockCluster

if TYPE_CHECKING:
    from tests.sinks.pubsub_emulator import Topic


@dataclass
class Bus:
    """How the sidecars publish (a `[[sinks]]` table) and how the fleet consumes."""

    sink: dict[str, Any]
    source: dict[str, Any]


def toml_table(header: str, values: dict[str, Any]) -> str:
    """`values` under `header`; a dict value becomes a sub-table (quoted keys: librdkafka's
    `session.timeout.ms` is one key, not three)."""
    lines = [header]
    lines += [f"{key} = {json.dumps(v)}" for key, v in values.items() if not isinstance(v, dict)]
    text = "\n".join(lines) + "\n"
    for key, table in values.items():
        if isinstance(table, dict):
            name = header.strip("[]")
            text += f"[{name}.{key}]\n"
            text += "".join(f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in table.items())
    return text


def pubsub_bus(topic: Topic) -> Bus:
    # A subscription without ordering: the fleet needs none, and redelivery is prompt.
    name = topic.subscription + "-fleet"
    topic.admin.subscriber.create_subscription(request={"name": name, "topic": topic.topic})
    return Bus(
        sink={"type": "pubsub", "topic": topic.topic, "timeout": 5.0},
        source={"type": "pubsub", "subscription": name, "batch_wait": 0.02},
    )


def eventhubs_bus(server: EventHubServer) -> Bus:
    return Bus(
        sink={"type": "eventhubs", "connection_string": server.connection_string, "timeout": 5.0},
        source={
            "type": "eventhubs",
            "connection_string": server.connection_string,
            "consumer_group": "fleet",
        },
    )


def kafka_bus(cluster: MockCluster) -> Bus:
    servers = cluster.bootstrap.split(",")
    topic = cluster.create_topic(partitions=4)
    return Bus(
        sink={"type": "kafka", "bootstrap_servers": servers, "topic": topic},
        source={
            "type": "kafka",
            "bootstrap_servers": servers,
            "topic": topic,
            "group_id": "fleet",  # replicas split the partitions
            "batch_wait": 0.02,
            # The mock cluster waits out a departed member's session before it rebalances.
            "options": {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
        },
    )
