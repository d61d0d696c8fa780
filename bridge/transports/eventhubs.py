"""Event Hubs as the sidecars' sink writes it and the fleet's `eventhubs` source reads it.

- Which hub: a connection string, or a namespace and a hub with Azure AD (`check_target`,
  the configuration check of both sides), and a producer or consumer client on it
  (`open_client`), with the credential to close after it.
- The CloudEvents AMQP binding: `to_event_data` builds the message of an event in binary
  (`cloudEvents_*` application properties) or structured mode; `event_body` turns a received
  message back into the event's structured JSON, in either mode.
- The sidecar's instance credential (`[identity]`): the application property
  ``bridgecredential`` in both modes (`bridge.infra.credential.ATTRIBUTE`), transport
  metadata outside the event (the binding reads only ``cloudEvents_*`` properties);
  `event_credential` reads it back.

`azure.eventhub` and `azure.identity` are imported inside the functions that need them, so
a configuration check loads neither.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

import msgspec
from cloudevents.core.bindings import amqp
from cloudevents.core.v1.event import CloudEvent

from bridge.infra.credential import ATTRIBUTE as CREDENTIAL_ATTRIBUTE
from bridge.infra.encoding import dumps, json_format, serialize
from bridge.infra.secrets import Secret

if TYPE_CHECKING:
    from azure.eventhub import EventData
    from azure.identity.aio import DefaultAzureCredential

_FORMAT: Final = json_format()
ClientT = TypeVar("ClientT")


class HubTarget(Protocol):
    """The keys that name a hub, as the sink's and the source's configurations hold them."""

    @property
    def connection_string(self) -> Secret | None: ...

    @property
    def fully_qualified_namespace(self) -> str | None: ...

    @property
    def eventhub(self) -> str | None: ...

    @property
    def transport(self) -> str: ...


def check_target(
    connection_string: Secret | None, fully_qualified_namespace: str | None, eventhub: str | None
) -> None:
    """A hub is named by a connection string, or by a namespace and a hub (Azure AD)."""
    if connection_string is not None:
        if fully_qualified_namespace is not None:
            raise ValueError(
                "set either connection_string or fully_qualified_namespace + eventhub, not both"
            )
    elif not fully_qualified_namespace or not eventhub:
        raise ValueError(
            "set connection_string, or fully_qualified_namespace and eventhub "
            "(Azure AD / managed identity)"
        )


def open_client(
    client_class: Callable[..., ClientT], target: HubTarget, **options: Any
) -> tuple[ClientT, DefaultAzureCredential | None]:
    """A producer or consumer client (`client_class`) on the hub of a `check_target`-valid
    `target`, with the credential to close after it (None with a connection string)."""
    from azure.eventhub import TransportType

    options["transport_type"] = (
        TransportType.AmqpOverWebsocket if target.transport == "websockets" else TransportType.Amqp
    )
    if target.connection_string is not None:
        client: ClientT = client_class.from_connection_string(  # type: ignore[attr-defined]
            target.connection_string.get_secret_value(), eventhub_name=target.eventhub, **options
        )
        return client, None
    from azure.identity.aio import DefaultAzureCredential

    assert target.fully_qualified_namespace
    assert target.eventhub
    credential = DefaultAzureCredential()
    client = client_class(target.fully_qualified_namespace, target.eventhub, credential, **options)
    return client, credential


def to_event_data(event: CloudEvent, mode: str, credential: str | None = None) -> EventData:
    """The AMQP message of `event` per the CloudEvents AMQP binding, carrying `credential`
    (the sidecar's, if it has one) as an application property."""
    from azure.eventhub import EventData

    if mode == "structured":
        message = amqp.to_structured(event, _FORMAT)
    else:
        message = amqp.to_binary(event, _FORMAT)
    data = EventData(message.application_data)
    content_type = message.properties.get(amqp.CONTENT_TYPE_PROPERTY)
    if content_type is not None:
        data.content_type = str(content_type)
    data.message_id = event.get_id()
    if message.application_properties:
        properties: dict[str, Any] = dict(message.application_properties)
        time = event.get_time()
        if time is not None and "cloudEvents_time" in properties:
            # The binding writes an int of milliseconds, which this SDK would encode as a
            # 32-bit int (and fail). A datetime is sent as the native AMQP timestamp, which
            # the binding reads back; sub-millisecond times keep the exact RFC 3339 string.
            properties["cloudEvents_time"] = _amqp_time(time)
        data.properties = dict(properties.items())
    if credential is not None:
        data.properties = {**(data.properties or {}), CREDENTIAL_ATTRIBUTE: credential}
    return data


def _amqp_time(time: datetime) -> datetime | str:
    if time.microsecond % 1000 == 0:
        return time
    return time.isoformat().replace("+00:00", "Z")


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def event_body(data: Any) -> bytes:
    """The structured JSON of the CloudEvent an `EventData` carries, in either mode.

    A binary-mode message as the sidecars' sink writes it (JSON data, string attributes,
    `time` an AMQP timestamp or an RFC 3339 string) is turned into JSON directly: the same
    attributes and data, in the same order, as the CloudEvents SDK's binding reads them,
    written by the same writer. Rebuilding each event as an SDK object (its JSON reader,
    dateutil for the time, its validation) cost more than the rest of the decode, per
    message. Anything else (another content type, a missing attribute, a value that is not
    a string, an odd time or extension name, data that is not strict JSON) goes through the
    SDK's binding, which fills in, refuses or keeps it as it always did: either way the
    result is the SDK's, byte for byte (tests/transports/test_eventhubs_binding.py)."""
    body = b"".join(data.body)
    content_type = data.content_type or ""
    if content_type.startswith("application/cloudevents"):
        return body  # structured: the event as the sidecar wrote it
    properties = {_text(k): _text(v) for k, v in (data.properties or {}).items()}
    direct = _binary_body(content_type, properties, body)
    if direct is not None:
        return direct
    return _through_sdk(content_type, properties, body)


def _through_sdk(content_type: str, properties: dict[Any, Any], body: bytes) -> bytes:
    """A binary- or structured-mode message read by the CloudEvents SDK's AMQP binding."""
    message = amqp.AMQPMessage(
        properties={"content-type": content_type},
        application_properties=properties,
        application_data=body,
    )
    event = amqp.from_amqp(message, _FORMAT, CloudEvent)
    return serialize(event)  # type: ignore[arg-type]


#: The binding's property prefixes (`cloudEvents_` and `cloudEvents:`), of one length.
_PREFIXES: Final = (amqp.CE_PREFIX_UNDERSCORE, amqp.CE_PREFIX_COLON)
_PREFIX_LENGTH: Final = len(amqp.CE_PREFIX_UNDERSCORE)
#: Attributes the SDK's CloudEvent names; any other is an extension, whose name it checks.
_NAMED: Final = frozenset(("id", "source", "type", "specversion", "datacontenttype"))
_NAMED_OR_OPTIONAL: Final = _NAMED | {"dataschema", "subject", "time"}
_EXTENSION_NAME: Final = re.compile(r"[a-z0-9]+")
#: RFC 3339 as the sink writes a time with sub-millisecond digits; where `fromisoformat`
#: and the SDK's dateutil read the same instant (wider forms go through the SDK).
_RFC3339: Final = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})")


def _binary_body(content_type: str, properties: dict[Any, Any], body: bytes) -> bytes | None:
    """The structured JSON of a binary-mode message, exactly as `_through_sdk` writes it, or
    None for anything outside the common case (then the SDK decides)."""
    if content_type != "application/json" or not body:
        return None
    attributes: dict[str, Any] = {}
    for name, value in properties.items():
        if not isinstance(name, str):
            return None
        attribute = name[_PREFIX_LENGTH:] if name.startswith(_PREFIXES) else ""
        if not attribute:
            continue  # not an attribute (the credential, say), as the SDK skips it
        value = _time(value) if attribute == "time" else _text_value(attribute, value)
        if value is None:
            return None
        attributes[attribute] = value
    attributes["datacontenttype"] = content_type
    if not attributes.keys() >= _NAMED or "time" not in attributes:
        return None  # the SDK fills in a missing id or time, or refuses the event
    if attributes["specversion"] != "1.0":
        return None
    try:
        event_data = _JSON.decode(body)  # stricter than the SDK's reader: where it fails,
    except (msgspec.DecodeError, ValueError, RecursionError):  # the SDK may read it as text
        return None
    if event_data is not None:
        attributes["data"] = event_data
    return dumps(attributes)


def _text_value(attribute: str, value: Any) -> str | None:
    """A non-empty string of an attribute the SDK's CloudEvent accepts by that name, else
    None (an empty or non-string value, an extension name it refuses: the SDK decides)."""
    if type(value) is not str or not value:
        return None
    if attribute not in _NAMED_OR_OPTIONAL and (
        attribute == "data" or _EXTENSION_NAME.fullmatch(attribute) is None
    ):
        return None
    return value


def _time(value: Any) -> datetime | None:
    """`time` as the SDK's binding reads it (an AMQP timestamp in milliseconds, an RFC 3339
    string), None where the SDK reads it otherwise or refuses it."""
    try:
        if type(value) is int:
            return datetime.fromtimestamp(value / 1000.0, tz=UTC)
        if isinstance(value, str) and _RFC3339.fullmatch(value):
            return datetime.fromisoformat(value)
    except (ValueError, OverflowError, OSError):
        return None
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value  # an EventData made here (a sink's), not received
    return None


_JSON: Final = msgspec.json.Decoder()


def event_credential(data: Any) -> str | None:
    """The instance credential an `EventData` carries, None without one (a value that is
    not text comes back as text that cannot verify, so it is refused, never a crash)."""
    properties = data.properties or {}
    value = properties.get(CREDENTIAL_ATTRIBUTE.encode(), properties.get(CREDENTIAL_ATTRIBUTE))
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace") or None
    return str(value) or None
