"""The contract every sink passes against its real local server.

Subclass `SinkContract` in `tests/sinks/test_<sink>.py` and implement the hooks; pytest then
runs every `test_*` method below for that sink. The hooks put the *real* server behind the
sink into the state a test needs (accepting, temporarily failing, rejecting); nothing is
mocked here.
"""

from __future__ import annotations

import abc
import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cloudevents.core.v1.event import CloudEvent

from bridge.pipeline.events import as_dict
from bridge.sinkapi import Ok, Reject, Retry, Sink, SinkClosedError
from tests.factories import sample_events

ROOT = Path(__file__).resolve().parents[2]


class SinkContract(abc.ABC):
    """Shared behaviour of all sinks (see module docstring)."""

    @abc.abstractmethod
    async def make_sink(self) -> Sink:
        """A sink pointed at the accepting server."""

    @abc.abstractmethod
    async def received(self) -> list[dict[str, Any]]:
        """Events the server holds, as structured-mode JSON objects, in arrival order."""

    @abc.abstractmethod
    async def make_transient_failure(self) -> None:
        """From now on the server fails in a way that is worth retrying (503, down, ...)."""

    @abc.abstractmethod
    async def make_permanent_failure(self) -> None:
        """From now on the server rejects what it is sent for good (400, not found, ...)."""

    def secrets(self) -> list[str]:
        """Secret strings configured on the sink: none may appear in its repr."""
        return []

    async def test_accepted_events_are_ok_and_arrive_intact(self) -> None:
        sink = await self.make_sink()
        events = sample_events(3)
        try:
            for event in events:
                assert isinstance(await sink.publish([event]), Ok)
        finally:
            await sink.close(5.0)
        got = await self.received()
        assert [e["id"] for e in got] == [e.get_id() for e in events]
        assert [e["data"] for e in got] == [as_dict(e)["data"] for e in events]

    async def test_transient_failure_is_retry(self) -> None:
        sink = await self.make_sink()
        await self.make_transient_failure()
        try:
            result = await sink.publish(sample_events(1))
        finally:
            await sink.close(5.0)
        assert isinstance(result, Retry), result
        assert result.reason

    async def test_permanent_failure_is_reject(self) -> None:
        sink = await self.make_sink()
        await self.make_permanent_failure()
        try:
            result = await sink.publish(sample_events(1))
        finally:
            await sink.close(5.0)
        assert isinstance(result, Reject), result
        assert result.reason

    async def test_close_is_idempotent_and_publish_after_close_is_refused(self) -> None:
        sink = await self.make_sink()
        await sink.close(5.0)
        await sink.close(5.0)
        with pytest.raises(SinkClosedError):
            await sink.publish(sample_events(1))

    async def test_secrets_never_in_repr(self) -> None:
        sink = await self.make_sink()
        try:
            text = repr(sink) + str(sink) + repr(vars(sink))
            for secret in self.secrets():
                assert secret not in text
        finally:
            await sink.close(5.0)


def first(events: list[CloudEvent]) -> CloudEvent:
    return events[0]


def modules_loaded_by_validating(config: dict[str, Any], *prefixes: str) -> list[str]:
    """Modules starting with `prefixes` that finding and validating a sink's `config` loads,
    in a fresh interpreter: a sink must import its SDK only when it is built."""
    code = (
        "import sys\n"
        "from bridge import sink_registry as registry\n"
        "from bridge.infra.validation import validate\n"
        f"validate(registry.config_model({config['type']!r}), {config!r})\n"
        f"print(sorted(m for m in sys.modules if m.startswith({prefixes!r})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = ast.literal_eval(done.stdout.strip())
    return loaded
