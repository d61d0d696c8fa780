"""The CloudEvents Kafka protocol binding, both ways, as pure functions (no Kafka client here).

The Kafka sink encodes with `to_record`; a consumer (the fleet source, a test, a user's own
service) decodes with `from_record` or `to_structured_json`, which recognize both modes:

* ``binary``: every context attribute is a ``ce_<name>`` header (UTF-8, the same string the
  structured JSON carries, e.g. ``time`` in RFC 3339), ``datacontenttype`` is the
  ``content-type`` header and the value is the event's data.
* ``structured``: the value is the whole event as JSON and the only header is
  ``content-type: application/cloudevents+json; charset=UTF-8``.

A sidecar with `[identity]` adds its instance credential as the header
``bridgecredential`` (`bridge.infra.credential.ATTRIBUTE`) in both modes: transport metadata
like the webhook's header, not a ``ce_`` header, so not part of the event
(`record_credential` reads it).

The message key is the event's ``partitionkey`` (Partitioning extension). Our events key by
VM, so an event without one gets ``partitionkey = source`` first: every VM's events land in
one partition, in order, and the attribute travels with the event in both modes, as the
binding asks (a receiver maps the key back to ``partitionkey``; here they are equal).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec
from cloudevents.core.v1.event import CloudEvent

from bridge.infra.credential import ATTRIBUTE as CREDENTIAL_ATTRIBUTE
from bridge.infra.encoding import dumps, parse, serialize

STRUCTURED_CONTENT_TYPE: Final = "application/cloudevents+json; charset=UTF-8"
CONTENT_TYPE_HEADER: Final = "content-type"
HEADER_PREFIX: Final = "ce_"
PARTITION_KEY: Final = "partitionkey"

Mode = Literal["binary", "structured"]
#: Headers as confluent-kafka hands them over: a list of pairs (values may be None) or a dict.
Headers = Iterable[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None] | None


@dataclass(frozen=True, slots=True)
class Record:
    """One Kafka message: what `Producer.produce(topic, value, key, headers=...)` takes."""

    key: bytes
    headers: list[tuple[str, bytes]]
    value: bytes


class BindingError(ValueError):
    """A Kafka message that is not a CloudEvent in either content mode."""


def to_record(event: CloudEvent, mode: Mode = "binary", credential: str | None = None) -> Record:
    """The Kafka message of `event` in `mode`, keyed by its partition key, carrying
    `credential` (the sidecar's, if it has one) as a header.

    Encoded straight from the event's attributes in the one JSON form
    (`bridge.infra.encoding.dumps`, whose JSON of a datetime is the RFC 3339 string the
    structured format carries, UTC as ``Z``), so both modes and
    `bridge.pipeline.events.serialize` describe an event identically (the tests compare them).
    """
    fields: dict[str, Any] = dict(event.get_attributes())
    if not fields.get(PARTITION_KEY):
        fields[PARTITION_KEY] = fields["source"]
    key = str(fields[PARTITION_KEY]).encode()
    data = event.get_data()
    if mode == "structured":
        if isinstance(data, bytes | bytearray):
            fields["data_base64"] = base64.b64encode(data).decode()
        elif data is not None:
            fields["data"] = data
        content_type = STRUCTURED_CONTENT_TYPE.encode()
        only = [(CONTENT_TYPE_HEADER, content_type), *_credential_header(credential)]
        return Record(key, only, dumps(fields))
    if isinstance(data, bytes | bytearray):
        value = bytes(data)
    elif isinstance(data, str):
        value = data.encode()
    else:
        value = b"" if data is None else dumps(data)
    headers: list[tuple[str, bytes]] = []
    for name, attribute in fields.items():
        if isinstance(attribute, str):
            text = attribute.encode()
        else:
            text = msgspec.json.encode(attribute).strip(b'"')
        header = CONTENT_TYPE_HEADER if name == "datacontenttype" else HEADER_PREFIX + name
        headers.append((header, text))
    return Record(key, [*headers, *_credential_header(credential)], value)


def _credential_header(credential: str | None) -> list[tuple[str, bytes]]:
    return [] if credential is None else [(CREDENTIAL_ATTRIBUTE, credential.encode())]


def record_credential(headers: Headers) -> str | None:
    """The instance credential a message carries, None without one (bytes that are not
    UTF-8 come back as text that cannot verify, so the message is refused, not dropped)."""
    pairs = headers.items() if isinstance(headers, Mapping) else (headers or [])
    for name, raw in pairs:
        if name.lower() == CREDENTIAL_ATTRIBUTE and raw:
            return raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    return None


def _header_map(headers: Headers) -> dict[str, str]:
    pairs = headers.items() if isinstance(headers, Mapping) else (headers or [])
    decoded: dict[str, str] = {}
    for name, raw in pairs:
        if raw is None:
            continue
        try:
            text = raw.decode() if isinstance(raw, bytes) else raw
        except UnicodeDecodeError as exc:
            raise BindingError(f"header {name!r} is not UTF-8") from exc
        decoded[name.lower()] = text
    return decoded


def mode_of(headers: Headers) -> Mode:
    """Which content mode a message uses: binary when it carries any ``ce_`` header."""
    names = _header_map(headers)
    return "binary" if any(n.startswith(HEADER_PREFIX) for n in names) else "structured"


def from_record(
    headers: Headers, value: bytes | None, key: bytes | str | None = None
) -> CloudEvent:
    """The CloudEvent a Kafka message carries, in either mode; `BindingError` if none.

    A message key and no ``partitionkey`` attribute give ``partitionkey = key``, as the
    binding's default key mapping asks of a receiver.
    """
    names = _header_map(headers)
    body = value or b""
    try:
        if any(n.startswith(HEADER_PREFIX) for n in names):
            fields: dict[str, Any] = {
                n[len(HEADER_PREFIX) :]: v for n, v in names.items() if n.startswith(HEADER_PREFIX)
            }
            content_type = names.get(CONTENT_TYPE_HEADER)
            if content_type is not None:
                fields["datacontenttype"] = content_type
            if body:
                if content_type is None or "json" in content_type:
                    fields["data"] = json.loads(body)
                else:
                    fields["data_base64"] = base64.b64encode(body).decode()
            event = parse(json.dumps(fields))
        else:
            content_type = names.get(CONTENT_TYPE_HEADER, "")
            if content_type and not content_type.startswith("application/cloudevents+json"):
                raise BindingError(
                    f"no ce_ headers and content-type {content_type!r}: not a CloudEvent"
                )
            event = parse(body)
    except BindingError:
        raise
    except Exception as exc:  # the SDK raises several types for a malformed event
        raise BindingError(f"not a valid CloudEvent: {type(exc).__name__}: {exc}") from exc
    if key is not None and not event.get_extension(PARTITION_KEY):
        text = key.decode(errors="replace") if isinstance(key, bytes) else key
        event = CloudEvent({**event.get_attributes(), PARTITION_KEY: text}, event.get_data())
    return event


def to_structured_json(
    headers: Headers, value: bytes | None, key: bytes | str | None = None
) -> bytes:
    """The structured-mode JSON of the event a Kafka message carries (what a spool stores)."""
    return serialize(from_record(headers, value, key))
