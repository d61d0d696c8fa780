"""The `bus` fixture (a pytest plugin: name it in a test module's `pytest_plugins`): each
bus of `tests.fleet.buses` in turn, with a sink and a source on it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.fleet.buses import Bus, eventhubs_bus, kafka_bus, pubsub_bus
from tests.sinks.eventhub_server import EventHubServer
from tests.sinks.kafka_mock import MockCluster, require_library

pytest_plugins = ["tests.sinks.pubsub_emulator"]


@pytest.fixture(params=["pubsub", "eventhubs", "kafka"])
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    """The Pub/Sub emulator, the Event Hubs test server or librdkafka's mock cluster, with a
    sink and a source on it."""
    if request.param == "pubsub":
        yield pubsub_bus(request.getfixturevalue("pubsub_topic"))
        return
    if request.param == "kafka":
        cluster = MockCluster(require_library())
        cluster.start()
        try:
            yield kafka_bus(cluster)
        finally:
            cluster.stop()
        return
    async with EventHubServer(partitions=4) as server:
        yield eventhubs_bus(server)
