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

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from cloudevents.core.bindings import amqp
from cloudevents.core.v1.event import CloudEvent

from bridge.infra.credential import ATTRIBUTE as CREDENTIAL_ATTRIBUTE
from bridge.infra.encoding import json_format, serialize
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
    """The structured JSON of the CloudEvent an `EventData` carries, in either mode."""
    body = b"".join(data.body)
    content_type = data.content_type or ""
    if content_type.startswith("application/cloudevents"):
        return body  # structured: the event as the sidecar wrote it
    message = amqp.AMQPMessage(
        properties={"content-type": content_type},
        application_properties={_text(k): _text(v) for k, v in (data.properties or {}).items()},
        application_data=body,
    )
    event = amqp.from_amqp(message, _FORMAT, CloudEvent)
    return serialize(event)  # type: ignore[arg-type]


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
