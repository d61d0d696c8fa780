"""An in-memory sink: the official fake for tests, like OpenTelemetry's InMemorySpanExporter.

It can be told to fail (`fail_next`) so that tests exercise the dispatcher's retry and
dead-letter paths with the same interface the real sinks use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Literal

from cloudevents.core.v1.event import CloudEvent

from bridge.sinkapi import Ok, Reject, Result, Retry, Sink, SinkConfig


class Config(SinkConfig, frozen=True, kw_only=True):
    type: Literal["memory"] = "memory"


class MemorySink(Sink):
    max_batch = 100

    def __init__(self, name: str = "memory") -> None:
        super().__init__(name)
        self.events: list[CloudEvent] = []
        self.attempts = 0
        self._scripted: list[Result] = []
        self._changed = asyncio.Condition()

    def fail_next(self, *results: Retry | Reject) -> None:
        """Answer the next publishes with these results instead of accepting them."""
        self._scripted.extend(results)

    async def _publish(self, batch: Sequence[CloudEvent]) -> Result:
        self.attempts += 1
        if self._scripted:
            return self._scripted.pop(0)
        async with self._changed:
            self.events.extend(batch)
            self._changed.notify_all()
        return Ok()

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[CloudEvent]:
        """Wait until at least `count` events arrived; return all of them."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: len(self.events) >= count)
        return list(self.events)

    def types(self) -> list[str]:
        return [event.get_type() for event in self.events]


def create(config: Config, name: str) -> MemorySink:
    return MemorySink(name)
