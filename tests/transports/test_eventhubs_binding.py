"""`event_body` builds a binary-mode message's structured JSON directly (no CloudEvents SDK
object per event): its result must be the SDK binding's, byte for byte, or the SDK's own
refusal, for every message: the events the sidecars send (as sent, and as received over
AMQP), and messages with extensions, missing attributes and odd values of every kind."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from azure.eventhub import EventData
from azure.eventhub._pyamqp._decode import decode_payload
from azure.eventhub._pyamqp._encode import encode_payload
from azure.eventhub._transport._pyamqp_transport import PyamqpTransport
from cloudevents.core.bindings import amqp
from cloudevents.core.v1.event import CloudEvent

from bridge.infra.encoding import json_format, parse, serialize
from bridge.pipeline.model import Kind, Status
from bridge.transports import eventhubs
from tests.factories import sample_events
from tests.fleet.factories import T0, azure_vm, gce_vm, heartbeat, transition


def sdk_body(data: Any) -> bytes:
    """What `event_body` returned before: every message through the SDK's AMQP binding."""
    body = b"".join(data.body)
    content_type = data.content_type or ""
    if content_type.startswith("application/cloudevents"):
        return body
    properties = {_text(k): _text(v) for k, v in (data.properties or {}).items()}
    message = amqp.AMQPMessage(
        properties={"content-type": content_type},
        application_properties=properties,
        application_data=body,
    )
    return serialize(amqp.from_amqp(message, json_format(), CloudEvent))  # type: ignore[arg-type]


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def outcome(fn: Any, data: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(data)
    except Exception as exc:
        return "error", f"{type(exc).__name__}: {exc}"


def received(sent: EventData) -> EventData:
    """`sent` as a consumer gets it: encoded by the client's AMQP codec and decoded again
    (keys and strings as bytes, a datetime as an AMQP timestamp in milliseconds)."""
    message = PyamqpTransport.to_outgoing_amqp_message(sent.raw_amqp_message)  # type: ignore[no-untyped-call]
    encoded = bytearray()
    encode_payload(encoded, message)
    return EventData._from_message(decode_payload(memoryview(bytes(encoded))))


def payload(data: Any) -> bytes:
    return b"".join(data.body)


def message(properties: dict[Any, Any], body: bytes, content_type: str | None) -> Any:
    return SimpleNamespace(body=[body], content_type=content_type, properties=properties)


def fleet_bodies() -> list[bytes]:
    """Transitions of GCE and Azure VMs of every status, and heartbeats."""
    bodies = []
    for index, status in enumerate(Status):
        vm = gce_vm(f"vm-{index}") if index % 2 else azure_vm(f"vm-{index}")
        at = T0 + timedelta(seconds=index, microseconds=index * 1001)  # some sub-ms times
        bodies.append(transition(vm, f"n-{index}", status, at, Kind.REBOOT, T0))
        bodies.append(heartbeat(vm, at, sequence=index))
    return bodies


def sent_events() -> list[EventData]:
    events = [parse(body) for body in fleet_bodies()] + sample_events(20)
    return [
        eventhubs.to_event_data(event, "binary", credential)
        for event in events
        for credential in (None, "token")
    ]


def test_the_sidecars_events_are_built_directly_as_the_sdk_builds_them() -> None:
    for sent in sent_events():
        for data in (sent, received(sent)):
            properties = {_text(k): _text(v) for k, v in data.properties.items()}
            direct = eventhubs._binary_body(data.content_type or "", properties, payload(data))
            assert direct is not None, "the common case must not need the SDK"
            assert direct == sdk_body(data)
            assert eventhubs.event_body(data) == direct


def test_structured_mode_is_kept_as_sent() -> None:
    (event,) = sample_events(1)
    data = eventhubs.to_event_data(event, "structured")
    assert eventhubs.event_body(data) == eventhubs.event_body(received(data)) == serialize(event)


BASE: dict[str, Any] = {
    "cloudEvents_specversion": "1.0",
    "cloudEvents_id": "e-1",
    "cloudEvents_source": "//compute.googleapis.com/projects/p/zones/z/instances/vm",
    "cloudEvents_type": "io.maintenancebridge.maintenance.scheduled",
    "cloudEvents_subject": "vm",
    "cloudEvents_time": 1795262400123,
}
DATA = b'{"provider":"gce","kind":"reboot"}'

ODD_PROPERTIES: list[dict[Any, Any]] = [
    {},
    {"cloudEvents_traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"},
    {"cloudEvents_partitionkey": "vm", "cloudEvents_ext1": "x"},
    {"cloudEvents:traceparent": "t", "cloudEvents:subject": "other"},
    {"cloudEvents_id": "e-2", "cloudEvents:id": "e-3"},
    {"cloudEvents_Bad": "x"},
    {"cloudEvents_with_underscore": "x"},
    {"cloudEvents_data": "x"},
    {"cloudEvents_abc\n": "x"},
    {"cloudEvents_": "x"},
    {"cloudEvents_ext": ""},
    {"cloudEvents_ext": 7},
    {"cloudEvents_ext": True},
    {"cloudEvents_ext": None},
    {"cloudEvents_subject": ""},
    {"cloudEvents_subject": 5},
    {"cloudEvents_dataschema": ""},
    {"cloudEvents_datacontenttype": "text/plain"},
    {"cloudEvents_specversion": "0.3"},
    {"cloudEvents_specversion": "2.0"},
    {"cloudEvents_specversion": 1},
    {"cloudEvents_id": ""},
    {"cloudEvents_source": None},
    {"cloudEvents_type": b"x"},
    {"bridgecredential": "token", "other": "ignored", 7: "an int key"},
    {"CLOUDEVENTS_id": "not the prefix"},
]
MISSING = ["cloudEvents_id", "cloudEvents_time", "cloudEvents_source", "cloudEvents_specversion"]
TIMES: list[Any] = [
    0,
    -1,
    1795262400000,
    1795262400999,
    2**62,
    True,
    1.5,
    "2026-11-21T12:00:00Z",
    "2026-11-21T12:00:00.1Z",
    "2026-11-21T12:00:00.123456Z",
    "2026-11-21T12:00:00.1234567Z",
    "2026-11-21T12:00:00.123+05:30",
    "2026-11-21T12:00:00-00:00",
    "2026-11-21T12:00:00+00:00",
    "2026-11-21T24:00:00Z",
    "2026-02-30T12:00:00Z",
    "2026-11-21 12:00:00Z",
    "2026-11-21T12:00:00z",
    "20261121T120000Z",
    "2026-11-21T12:00:00",
    "2026-11-21T12:00:60Z",
    "2026-11-21T12:00:00+24:00",
    "yesterday",
    "",
    datetime(2026, 11, 21, 12, tzinfo=UTC),
    datetime(2026, 11, 21, 12, 0, 0, 1, tzinfo=timezone(timedelta(hours=-3))),
    datetime(2026, 11, 21, 12),
    None,
]
BODIES: list[bytes] = [
    DATA,
    b"",
    b"null",
    b"[1,2,3]",
    b"42",
    b'"text"',
    b"not json",
    b"{",
    b"NaN",
    b'{"x":NaN}',
    b'{"x":1e400}',
    b'{"x":123456789012345678901234567890}',
    b'{"x":-0,"y":-0.0,"z":5e-324}',
    b'{"a":1,"a":2}',
    b'{"s":"\\ud800"}',
    b'{"s":"a\tb"}',
    b'{"s":"caf\xc3\xa9 \\u00e9 \\u2028 \x7f"}',
    b'{"s":"\xff\xfe"}',
    b"\xef\xbb\xbf{}",
    b" {} ",
    b"[" * 5000 + b"]" * 5000,
]
CONTENT_TYPES: list[str | None] = [
    "application/json",
    "application/json; charset=utf-8",
    "text/json",
    "text/plain",
    "application/octet-stream",
    "",
    None,
    "Application/CloudEvents+json",
]


def odd_messages() -> list[Any]:
    messages = [message({**BASE, **extra}, DATA, "application/json") for extra in ODD_PROPERTIES]
    for name in MISSING:
        messages.append(
            message({k: v for k, v in BASE.items() if k != name}, DATA, "application/json")
        )
    messages += [message({**BASE, "cloudEvents_time": t}, DATA, "application/json") for t in TIMES]
    messages += [message(BASE, body, "application/json") for body in BODIES]
    messages += [message(BASE, DATA, content_type) for content_type in CONTENT_TYPES]
    messages.append(message({k.encode(): v for k, v in BASE.items()}, DATA, "application/json"))
    messages.append(message({**BASE, b"cloudEvents_x": b"\xff"}, DATA, "application/json"))
    return messages


def comparable(result: tuple[str, Any], data: Any) -> tuple[str, Any]:
    """The SDK makes up an `id` (a random UUID) and a `time` (now) an event lacks: such an
    outcome is compared without them."""
    kind, value = result
    given = {_text(k) for k in data.properties}
    if kind != "ok" or not value.startswith(b"{"):
        return result
    fields = msgspec.json.decode(value)
    for name in ("id", "time"):
        if not given & {f"cloudEvents_{name}", f"cloudEvents:{name}"}:
            fields.pop(name, None)
    return kind, fields


@pytest.mark.parametrize("index", range(len(odd_messages())))
def test_an_odd_message_comes_out_as_the_sdk_makes_or_refuses_it(index: int) -> None:
    data = odd_messages()[index]
    assert comparable(outcome(eventhubs.event_body, data), data) == comparable(
        outcome(sdk_body, data), data
    )


def test_many_mutated_messages_come_out_as_the_sdk_makes_or_refuses_them() -> None:
    """Random combinations of the odd values above on the sidecars' own messages."""
    rng = random.Random(33)
    pool = [received(sent) for sent in sent_events()]
    oddities = [
        *({**extra} for extra in ODD_PROPERTIES),
        *({"cloudEvents_time": t} for t in TIMES),
    ]
    for _ in range(2000):
        base = rng.choice(pool)
        properties: dict[Any, Any] = {_text(k): v for k, v in base.properties.items()}
        for extra in rng.sample(oddities, rng.choice((0, 0, 0, 1, 1, 2, 3))):
            properties.update(extra)
        for name in rng.sample(MISSING, rng.choice((0,) * 9 + (1,))):
            properties.pop(name, None)
        sent_body = payload(base)
        body = sent_body if rng.random() < 0.8 else rng.choice(BODIES[:-1])
        content_type = "application/json" if rng.random() < 0.8 else rng.choice(CONTENT_TYPES)
        data = message(properties, body, content_type)
        assert comparable(outcome(eventhubs.event_body, data), data) == comparable(
            outcome(sdk_body, data), data
        ), (properties, body, content_type)
