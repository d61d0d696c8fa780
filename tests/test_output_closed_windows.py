"""On Windows a write into a pipe whose reader went away fails with EINVAL, not EPIPE: the
commands and the stdout sink treat it as the closed pipe it is, and nothing else as one.

Windows cannot run here, so the closed pipe is a stand-in stdout that raises what Windows
raises (`OSError(EINVAL)`), with `sys.platform` set to "win32"; the POSIX side runs for real
in tests/test_output_closed.py.
"""

from __future__ import annotations

import errno
import io
import sys

import pytest

from bridge.infra import stdout
from bridge.infra.stdout import EXIT_OUTPUT_CLOSED, exits_quietly_when_output_closes
from bridge.sinkapi import Retry
from sinks.stdout import StdoutSink
from tests.factories import sample_events


class ClosedPipe(io.StringIO):
    """A stdout whose reader went away, as Windows reports it."""

    def flush(self) -> None:
        raise OSError(errno.EINVAL, "Invalid argument")


def test_einval_is_a_closed_pipe_on_windows_only(monkeypatch: pytest.MonkeyPatch) -> None:
    einval = OSError(errno.EINVAL, "Invalid argument")
    assert stdout.output_closed(BrokenPipeError(errno.EPIPE, "Broken pipe"))
    monkeypatch.setattr(sys, "platform", "linux")
    assert not stdout.output_closed(einval)
    monkeypatch.setattr(sys, "platform", "win32")
    assert stdout.output_closed(einval)
    assert not stdout.output_closed(OSError(errno.ENOSPC, "No space left on device"))


def test_a_command_ends_quietly_when_windows_says_einval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    monkeypatch.setattr(stdout, "_stdout_is_a_pipe", lambda: True)
    discarded: list[bool] = []
    monkeypatch.setattr(stdout, "_discard_stdout", lambda: discarded.append(True))
    assert exits_quietly_when_output_closes(lambda: 0) == EXIT_OUTPUT_CLOSED
    assert discarded == [True]


def test_einval_elsewhere_than_a_closed_pipe_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    monkeypatch.setattr(stdout, "_stdout_is_a_pipe", lambda: False)  # a file or a console
    with pytest.raises(OSError, match="Invalid argument"):
        exits_quietly_when_output_closes(lambda: 0)


async def test_the_stdout_sink_stops_the_demo_on_windows_einval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    closed: list[bool] = []
    sink = StdoutSink("out", on_closed=lambda: closed.append(True))
    result = await sink.publish(sample_events(1))
    assert isinstance(result, Retry)
    assert closed == [True]
