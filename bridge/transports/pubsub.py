"""The CloudEvents Pub/Sub binding, both ways, as the sidecars' sink writes a message and
the fleet's `pubsub` source reads it back (no Pub/Sub client here).

* ``binary``: the message data is the event's JSON ``data``; every context attribute is a
  message attribute ``ce-<name>`` (the same string the structured JSON carries, e.g.
  ``time`` in RFC 3339) and ``datacontenttype`` is ``content-type``.
* ``structured``: the message data is the whole event as JSON and the only attribute is
  ``content-type: application/cloudevents+json; charset=UTF-8``.

Pub/Sub limits attributes (keys <= 256 bytes, values <= 1024 bytes, at most 100 per
message): `fits_attribute_limits` says whether a binary-mode message keeps them.

In both modes a sidecar with `[identity]` adds its instance credential as the attribute
``bridgecredential`` (`bridge.infra.credential.ATTRIBUTE`, <= 1,024 bytes): transport
metadata like the webhook's header, never a ``ce-`` attribute, so it is not part of the
event the fleet stores (`message_event` ignores it, `message_credential` reads it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from cloudevents.core.v1.event import CloudEvent

from bridge import contract
from bridge.infra.credential import ATTRIBUTE as CREDENTIAL_ATTRIBUTE
from bridge.infra.encoding import as_dict, dumps

STRUCTURED_CONTENT_TYPE: Final = "application/cloudevents+json; charset=UTF-8"
#: The OAuth scope of the Pub/Sub API, for credentials from a service-account key file.
PUBSUB_SCOPE: Final = "https://www.googleapis.com/auth/pubsub"
MAX_ATTRIBUTES: Final = 100
MAX_KEY_BYTES: Final = 256
MAX_VALUE_BYTES: Final = 1024


def binary_attributes(event: CloudEvent) -> tuple[bytes, dict[str, str]]:
    """Data and attributes of a binary-mode message (the JSON data, ``ce-*`` attributes).

    Attribute values are the same strings the structured JSON carries (e.g. ``time`` as
    RFC 3339), so both modes describe an event identically.
    """
    fields = as_dict(event)
    if "data_base64" in fields:
        import base64

        data = base64.b64decode(fields.pop("data_base64"))
    elif "data" in fields:
        value = fields.pop("data")
        data = value.encode() if isinstance(value, str) else dumps(value)
    else:
        data = b""
    attributes: dict[str, str] = {}
    for name, value in fields.items():
        text = value if isinstance(value, str) else json.dumps(value)
        key = "content-type" if name == "datacontenttype" else f"ce-{name}"
        attributes[key] = text
    return data, attributes


def fits_attribute_limits(attributes: dict[str, str]) -> str | None:
    """Why `attributes` break Pub/Sub's limits, or None when they fit."""
    if len(attributes) > MAX_ATTRIBUTES:
        return f"{len(attributes)} attributes (max {MAX_ATTRIBUTES})"
    for key, value in attributes.items():
        if len(key.encode()) > MAX_KEY_BYTES:
            return f"attribute key {key[:40]!r}... longer than {MAX_KEY_BYTES} bytes"
        if len(value.encode()) > MAX_VALUE_BYTES:
            return f"attribute {key!r} longer than {MAX_VALUE_BYTES} bytes"
    return None


def message_event(data: bytes, attributes: Mapping[str, str]) -> bytes:
    """The structured JSON of the event a message carries, in either content mode."""
    if "ce-specversion" in attributes:
        return contract.binary_to_structured(dict(attributes), data)
    return data


def with_credential(attributes: Mapping[str, str], credential: str | None) -> dict[str, str]:
    """`attributes` plus the sidecar's instance credential, when it has one."""
    if credential is None:
        return dict(attributes)
    return {**attributes, CREDENTIAL_ATTRIBUTE: credential}


def message_credential(attributes: Mapping[str, str]) -> str | None:
    """The instance credential a message carries, None without one."""
    return attributes.get(CREDENTIAL_ATTRIBUTE) or None
