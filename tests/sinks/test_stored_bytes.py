"""The file and stdout sinks write the spooled bytes as they are (`publish_encoded`), the same
lines `publish` writes for the parsed events: the line a log shipper reads does not depend on
which path the event took."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.pipeline.events import serialize
from bridge.pipeline.spool import Spooled
from bridge.sinkapi import Ok
from sinks.file import FileSink
from sinks.stdout import StdoutSink
from tests.factories import sample_events


async def test_the_file_sink_appends_the_spooled_bytes_as_its_lines(tmp_path: Path) -> None:
    events = sample_events(3)
    stored = [Spooled(seq, e.get_id(), serialize(e), 0) for seq, e in enumerate(events)]
    parsed, encoded = FileSink("a", tmp_path / "a.jsonl"), FileSink("b", tmp_path / "b.jsonl")
    assert await parsed.publish(events) == Ok()
    assert await encoded.publish_encoded(stored) == Ok()
    written = (tmp_path / "b.jsonl").read_bytes()
    assert written == b"".join(item.body + b"\n" for item in stored)
    assert written == (tmp_path / "a.jsonl").read_bytes()


async def test_the_stdout_sink_prints_the_spooled_bytes_as_its_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    events = sample_events(2)
    stored = [Spooled(seq, e.get_id(), serialize(e), 0) for seq, e in enumerate(events)]
    sink = StdoutSink("out")
    assert await sink.publish(events) == Ok()
    from_events = capsys.readouterr().out
    assert await sink.publish_encoded(stored) == Ok()
    from_bytes = capsys.readouterr().out
    assert from_bytes == from_events == "".join(item.body.decode() + "\n" for item in stored)
