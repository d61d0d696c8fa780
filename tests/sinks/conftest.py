"""Fixtures shared by the sink tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.sinks.webhook_receiver import WebhookReceiver


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    """A scriptable webhook receiver on 127.0.0.1, stopped after the test."""
    server = await WebhookReceiver().start()
    yield server
    await server.stop()
