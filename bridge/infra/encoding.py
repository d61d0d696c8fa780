"""The wire format: structured-mode JSON CloudEvents (`application/cloudevents+json`).

Every event the sidecar makes is written once, by `bridge.contract.encode`, and spooled; the
sinks send those bytes as they are wherever their binding allows (structured and batch mode).
What this module writes is for a CloudEvents SDK object: an event handed to a sink's
`publish` directly (`doctor --send-test-event`) or read back from spooled bytes by a sink that
needs its attributes (binary mode, Kafka, Pub/Sub, Event Hubs). It writes the contract's one
JSON form (the standard library's compact JSON, non-ASCII escaped) and keeps the attribute
order it was given, so an event read back from `contract.encode`'s bytes is written to the
same bytes (tests/test_typed_bytes.py checks it). It knows nothing of the maintenance
contract, so the sink plug-ins (`bridge.sinkapi`) use it without importing the pipeline. The SDK's
JSON format (and the date parser it pulls in) is imported at the first use, not with
`bridge.sinkapi`: the configuration imports that surface, and `--help` must stay fast.
"""

from __future__ import annotations

import base64
import json
from functools import cache
from typing import TYPE_CHECKING, Any, Final

import msgspec
from cloudevents.core.v1.event import CloudEvent

if TYPE_CHECKING:
    from cloudevents.core.formats.json import JSONFormat


_ENCODER: Final = msgspec.json.Encoder()


def dumps(value: Any) -> bytes:
    """The one JSON form of `value` (a CloudEvent's fields, or its `data`), keys in order:
    compact, datetimes as RFC 3339 (UTC with a `Z`), non-ASCII characters and DEL as `\\u`
    escapes, as `bridge.contract.encode` writes an event (the layers keep the two modules
    apart; tests/test_typed_bytes.py checks they write the same bytes)."""
    body = _ENCODER.encode(value)
    if body.isascii() and b"\x7f" not in body:
        return body
    return _ESCAPING.encode(msgspec.to_builtins(value)).encode()  # as `contract.encode` does


_ESCAPING: Final = json.JSONEncoder(separators=(",", ":"))


def fields(event: CloudEvent) -> dict[str, Any]:
    """The members of `event`'s structured JSON, in order: its attributes as it holds them,
    then `data` (or `data_base64` for binary data)."""
    result: dict[str, Any] = dict(event.get_attributes())
    data = event.get_data()
    if isinstance(data, bytes | bytearray):
        result["data_base64"] = base64.b64encode(data).decode()
    elif data is not None:
        json_data = "json" in str(result.get("datacontenttype", "application/json"))
        result["data"] = data if json_data else str(data)
    return result


def serialize(event: CloudEvent) -> bytes:
    """Structured-mode JSON (`application/cloudevents+json`) in the one JSON form."""
    return dumps(fields(event))


@cache
def _format() -> JSONFormat:
    from cloudevents.core.formats.json import JSONFormat

    class OneForm(JSONFormat):
        """The SDK's JSON format writing the one JSON form: what its bindings (HTTP binary
        mode, AMQP) are given, so their bodies are written as everything else is."""

        def write(self, event: Any) -> bytes:
            return serialize(event)

        def write_data(self, data: Any, datacontenttype: str | None) -> bytes:
            if data is None:
                return b""
            if isinstance(data, bytes | bytearray):
                return bytes(data)
            if isinstance(data, str):
                return data.encode()
            return dumps(data)

    return OneForm()


def json_format() -> JSONFormat:
    """The format to give the SDK's bindings (`to_binary`, `amqp.to_structured`...)."""
    return _format()


def parse(body: bytes | str) -> CloudEvent:
    """Read back what `serialize` wrote (or any structured-mode JSON CloudEvent)."""
    event = _format().read(None, body)
    assert isinstance(event, CloudEvent)
    return event


def as_dict(event: CloudEvent) -> dict[str, Any]:
    """The event as the JSON object consumers see (what the schema validates)."""
    result: dict[str, Any] = json.loads(serialize(event))
    return result
