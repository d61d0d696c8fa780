"""Fixtures shared by the sink tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from tests.sinks.kafka_mock import MockCluster, require_library
from tests.sinks.webhook_receiver import WebhookReceiver


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    """A scriptable webhook receiver on 127.0.0.1, stopped after the test."""
    server = await WebhookReceiver().start()
    yield server
    await server.stop()


@pytest.fixture
def kafka_cluster() -> Iterator[MockCluster]:
    """A fresh three-broker mock cluster for one test (starting one takes milliseconds)."""
    cluster = MockCluster(require_library())
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
