"""The wire format: structured-mode JSON CloudEvents (`application/cloudevents+json`).

What the spool stores and what every sink sends or reads back. It knows nothing of the
maintenance contract (that is `bridge.contract` and `bridge.pipeline.events`), so the sink
plug-ins (`bridge.sinkapi`) use it without importing the pipeline. The SDK's JSON format (and
the date parser it pulls in) is imported at the first use, not with `bridge.sinkapi`: the
configuration imports that surface, and `--help` must stay fast.
"""

from __future__ import annotations

import json
from functools import cache
from typing import TYPE_CHECKING, Any

from cloudevents.core.v1.event import CloudEvent

if TYPE_CHECKING:
    from cloudevents.core.formats.json import JSONFormat


@cache
def _format() -> JSONFormat:
    from cloudevents.core.formats.json import JSONFormat

    return JSONFormat()


def serialize(event: CloudEvent) -> bytes:
    """Structured-mode JSON (`application/cloudevents+json`): what the spool stores."""
    return _format().write(event)


def parse(body: bytes | str) -> CloudEvent:
    """Read back what `serialize` wrote (or any structured-mode JSON CloudEvent)."""
    event = _format().read(None, body)
    assert isinstance(event, CloudEvent)
    return event


def as_dict(event: CloudEvent) -> dict[str, Any]:
    """The event as the JSON object consumers see (what the schema validates)."""
    result: dict[str, Any] = json.loads(serialize(event))
    return result
