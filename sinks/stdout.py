"""Writes each event as one JSON line to standard output (the demo's sink, and `once`)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Literal

from cloudevents.core.v1.event import CloudEvent

from bridge.infra.stdout import output_closed
from bridge.sinkapi import Encoded, Ok, Result, Retry, Sink, SinkConfig, serialize


class Config(SinkConfig, frozen=True, kw_only=True):
    type: Literal["stdout"] = "stdout"
    pretty: bool = False


class StdoutSink(Sink):
    max_batch = 100

    def __init__(
        self, name: str, pretty: bool = False, on_closed: Callable[[], None] | None = None
    ) -> None:
        """`on_closed` is called when the reader of stdout went away (`demo | head -1`):
        the demo stops then; a sidecar's stdout sink keeps retrying instead."""
        super().__init__(name)
        self._pretty = pretty
        self._on_closed = on_closed

    async def _publish(self, batch: Sequence[CloudEvent]) -> Result:
        return self._write([serialize(event) for event in batch])

    async def _publish_encoded(self, batch: Sequence[Encoded]) -> Result:
        """The spooled bytes are the line: no parsing them back to write them again."""
        return self._write([item.body for item in batch])

    def _write(self, bodies: Sequence[bytes]) -> Result:
        import json

        try:
            for body in bodies:
                line = body.decode()
                if self._pretty:
                    line = json.dumps(json.loads(line), indent=2)
                sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except OSError as exc:  # a closed pipe is transient from our point of view
            # BrokenPipeError, or EINVAL on Windows: the reader went away either way.
            if output_closed(exc) and self._on_closed is not None:
                self._on_closed()
            return Retry(f"cannot write to stdout: {exc}")
        return Ok()


def create(config: Config, name: str) -> StdoutSink:
    return StdoutSink(name, pretty=config.pretty)
