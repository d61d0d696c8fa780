"""The typed event contract of schema version 1: what a consumer needs to read our events.

Both sides import this module: the sidecar writes events whose `data` these Structs describe,
and a consumer (the fleet service, or anyone's own program) turns the bytes it received back
into typed values with `from_cloudevent`. It depends on msgspec and the standard library only
(no HTTP client, no retry library, not even the CloudEvents SDK), so reading an event costs a
consumer one small import.

Decoding *is* validation: the Structs carry the schema's constraints (enums as `Literal`s,
non-empty strings, timezone-aware timestamps, non-negative durations), every required
property is a field without a default, and the envelope's constants are checked. An event
that decodes is valid against `schemas/maintenance-event.v1.json`; one that does not raises
`ContractError` naming the reason. `tests/test_contract.py` compares every `$def` of the
schema with its Struct, property by property, so the two cannot drift apart.

Unknown fields are ignored, as schema v1 asks of consumers: version 1 only grows by addition.

`encode` here is the one writer of an event's bytes: the sidecar builds every event it sends
(a notice's, an audit record's, a heartbeat) as an `Event` and writes it with `encode`, and a
consumer re-emits what it read the same way.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal, cast
from urllib.parse import unquote

import msgspec

#: The version of the `data` schema: it names the schema file (`bridge.pipeline.events`) and
#: ends SCHEMA_URI (a literal, the type of `dataschema`; tests/test_layers.py checks they agree).
SCHEMA_VERSION: Final = 1
SCHEMA_URI: Final = "https://maintenancebridge.io/schemas/maintenance-event/v1.json"
CONTENT_TYPE: Final = "application/json"
SPEC_VERSION: Final = "1.0"

TYPE_PREFIX: Final = "io.maintenancebridge.maintenance."
SCHEDULED: Final = TYPE_PREFIX + "scheduled"
STARTED: Final = TYPE_PREFIX + "started"
COMPLETED: Final = TYPE_PREFIX + "completed"
CANCELLED: Final = TYPE_PREFIX + "cancelled"
MAINTENANCE_TYPES: Final = (SCHEDULED, STARTED, COMPLETED, CANCELLED)
APPROVED: Final = TYPE_PREFIX + "approved"
HOOK_COMPLETED: Final = "io.maintenancebridge.hook.completed"
TEST: Final = "io.maintenancebridge.test"
HEARTBEAT: Final = "io.maintenancebridge.agent.heartbeat"
BUDGET_RELEASED: Final = "io.maintenancebridge.budget.released"
BUDGET_UNRENEWED: Final = "io.maintenancebridge.budget.unrenewed"

ProviderName = Literal["gce", "azure", "aws"]
KindName = Literal[
    "live-migrate", "terminate", "freeze", "reboot", "redeploy", "preempt", "delete", "unknown"
]
StatusName = Literal["scheduled", "started", "completed", "cancelled"]
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
#: The CloudEvents distributed-tracing extension: a W3C Trace Context `traceparent`
#: (version, trace id, parent id, flags), as the schema's `traceparent` pattern says.
TRACEPARENT_PATTERN: Final = r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
TraceParent = Annotated[str, msgspec.Meta(pattern=TRACEPARENT_PATTERN)]
Timestamp = Annotated[datetime, msgspec.Meta(tz=True)]


class ContractError(ValueError):
    """The bytes are not an event of schema v1; the message says why (safe to show)."""


class _Data(msgspec.Struct, frozen=True, kw_only=True):
    """Base of the `data` shapes: immutable, keyword-only, unknown fields ignored."""


class InstanceData(_Data, frozen=True, kw_only=True, omit_defaults=True):
    """`$defs/instance`: the VM's identity as its metadata service reports it.

    `account` and `instance_type` came with AWS (additively): written only when set, so the
    other providers' events stay byte for byte what they were.
    """

    id: str
    name: str
    zone: str | None
    location: str | None
    project: str | None
    subscription: str | None
    resource_group: str | None
    scale_set: str | None
    resource_id: str
    account: str | None = None
    instance_type: str | None = None


class WindowData(_Data, frozen=True, kw_only=True):
    """`$defs/maintenance/properties/window` when not null (GCE upcoming-maintenance)."""

    start: Timestamp | None
    end: Timestamp | None
    latest_start: Timestamp | None


class MaintenanceData(_Data, frozen=True, kw_only=True, omit_defaults=True):
    """`$defs/maintenance`: the data of the four maintenance types (one notice, one state).

    `outcome_inferred` came later (additively): written only when true, so every event
    written before it still reads, and writes back, byte for byte the same.
    """

    provider: ProviderName
    instance: InstanceData
    kind: KindName
    status: StatusName
    notice_id: NonEmpty
    not_before: Timestamp | None
    not_before_estimated: bool
    window: WindowData | None
    duration_seconds: Annotated[int, msgspec.Meta(ge=0)] | None
    affected: list[str]
    origin: Literal["platform", "user"] | None
    description: str | None
    can_reschedule: bool | None
    raw: Any
    outcome_inferred: bool = False


class TriggerData(_Data, frozen=True, kw_only=True):
    """`$defs/trigger`: the maintenance event an action answered (in every audit event)."""

    provider: ProviderName
    instance: InstanceData
    notice_id: NonEmpty
    event_id: NonEmpty
    event_type: str


class BudgetData(_Data, frozen=True, kw_only=True):
    """`$defs/budget`: how a disruptive action took a slot of its group's maintenance budget
    (docs/coordination.md)."""

    group: str
    member: str
    outcome: Literal["acquired", "timed-out", "unavailable", "withdrawn"]
    waited_seconds: Annotated[float, msgspec.Meta(ge=0)]
    acquired_at: Timestamp | None
    slot: str | None = None


class ApprovedData(TriggerData, frozen=True, kw_only=True, omit_defaults=True):
    """`$defs/approved`: this VM sent the provider's approval (Azure StartRequests)."""

    approved_by: str
    rule: str
    leader: Literal["sorted-first", "self"]
    budget: BudgetData | None = None  # with [coordination] only


class HookCompletedData(TriggerData, frozen=True, kw_only=True, omit_defaults=True):
    """`$defs/hook_completed`: one run of one hook for one transition."""

    hook: NonEmpty
    outcome: Literal["succeeded", "failed", "timed-out", "skipped", "interrupted"]
    exit_code: int | None
    timed_out: bool
    duration_seconds: Annotated[float, msgspec.Meta(ge=0)]
    output_tail: str
    error: str | None
    budget: BudgetData | None = None  # a hook marked `budget = true`, with [coordination]


class HeldSlotData(_Data, frozen=True, kw_only=True):
    """`$defs/budget_released/properties/budget`: who held which slot from when to when."""

    group: str
    member: str
    slot: str
    acquired_at: Timestamp
    released_at: Timestamp
    held_seconds: Annotated[float, msgspec.Meta(ge=0)]


class BudgetReleasedData(TriggerData, frozen=True, kw_only=True):
    """`$defs/budget_released`: this VM gave its budget slot back (the notice ended)."""

    budget: HeldSlotData


class UnrenewedSlotData(_Data, frozen=True, kw_only=True):
    """`$defs/budget_unrenewed/properties/budget`: a held slot whose lease was not renewed by
    the holder's local deadline (docs/coordination.md, "Time limits")."""

    group: str
    member: str
    slot: str
    acquired_at: Timestamp
    unrenewed_at: Timestamp
    lease_ttl_seconds: Annotated[float, msgspec.Meta(gt=0)]
    reason: str


class BudgetUnrenewedData(TriggerData, frozen=True, kw_only=True):
    """`$defs/budget_unrenewed`: this VM can no longer count on its budget slot (the lease
    may expire and another member take the slot) while the notice that holds it is in force."""

    budget: UnrenewedSlotData


class TestData(_Data, frozen=True, kw_only=True, omit_defaults=True):
    """`$defs/test`: a test event sent on request; consumers may drop it."""

    __test__ = False  # pytest must not collect it

    provider: ProviderName | None = None  # optional in the schema: omitted when unknown
    instance: InstanceData
    message: str
    sent_at: Timestamp


class HeartbeatData(_Data, frozen=True, kw_only=True):
    """`$defs/heartbeat`: the sidecar is alive and watching (sent at start, then every
    `interval_seconds`); a fleet that stops hearing them knows the VM is not covered."""

    provider: ProviderName
    instance: InstanceData
    agent_version: NonEmpty
    interval_seconds: Annotated[float, msgspec.Meta(gt=0)]
    started_at: Timestamp
    watcher_healthy: bool
    spool_depth: Annotated[int, msgspec.Meta(ge=0)]


EventData = (
    MaintenanceData
    | ApprovedData
    | HookCompletedData
    | BudgetReleasedData
    | BudgetUnrenewedData
    | TestData
    | HeartbeatData
)

#: The `data` shape of every known type: the one table a reader needs.
DATA_TYPES: Final[Mapping[str, type[EventData]]] = {
    **dict.fromkeys(MAINTENANCE_TYPES, MaintenanceData),
    APPROVED: ApprovedData,
    HOOK_COMPLETED: HookCompletedData,
    TEST: TestData,
    HEARTBEAT: HeartbeatData,
    BUDGET_RELEASED: BudgetReleasedData,
    BUDGET_UNRENEWED: BudgetUnrenewedData,
}
#: The `$defs` entry of each data Struct (what the drift test compares).
SCHEMA_DEFS: Final[Mapping[type[_Data], str]] = {
    InstanceData: "instance",
    MaintenanceData: "maintenance",
    TriggerData: "trigger",
    ApprovedData: "approved",
    HookCompletedData: "hook_completed",
    TestData: "test",
    HeartbeatData: "heartbeat",
    BudgetData: "budget",
    BudgetReleasedData: "budget_released",
    BudgetUnrenewedData: "budget_unrenewed",
}


def _always_written(value: str) -> Any:
    """The default of a constant attribute, still written under `omit_defaults`: msgspec
    leaves out a field equal to a default given by value, but not one a factory of its own
    makes (only empty collections count there), and every event carries its constants."""
    return msgspec.field(default_factory=lambda: value)


class Event(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One event of schema v1: the CloudEvents attributes and its typed `data`.

    The fields are declared in the order `encode` writes them (the attributes, then `data`):
    msgspec writes a Struct's fields in their declared order, so this order *is* the wire's.
    An unset `traceparent` is left out (`omit_defaults`); the constant attributes always
    appear (`_always_written`).
    """

    specversion: Literal["1.0"] = _always_written(SPEC_VERSION)
    id: NonEmpty
    source: NonEmpty
    type: str
    subject: NonEmpty
    time: Timestamp
    datacontenttype: Literal["application/json"] = _always_written(CONTENT_TYPE)
    dataschema: Literal["https://maintenancebridge.io/schemas/maintenance-event/v1.json"] = (
        _always_written(SCHEMA_URI)
    )
    #: The CloudEvents distributed-tracing extension (W3C Trace Context; additive, issue 35);
    #: None on events written before it, which are then written without it.
    traceparent: TraceParent | None = None
    data: EventData

    @property
    def is_maintenance(self) -> bool:
        return self.type in MAINTENANCE_TYPES

    @property
    def instance(self) -> InstanceData:
        return self.data.instance

    @property
    def provider(self) -> ProviderName | None:
        return self.data.provider


class _Envelope(msgspec.Struct, frozen=True, kw_only=True):
    """The attributes, checked; `data` kept raw until the type says what it must be."""

    specversion: Literal["1.0"]
    id: NonEmpty
    source: NonEmpty
    type: str
    time: Timestamp
    subject: NonEmpty
    datacontenttype: Literal["application/json"]
    dataschema: Literal["https://maintenancebridge.io/schemas/maintenance-event/v1.json"]
    data: msgspec.Raw
    traceparent: TraceParent | None = None


class _Typed(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """`_Envelope`'s attributes, for one known `type` (the tag) and its `data` shape: the
    members of `_TYPED`, the union that decodes an event in one pass."""

    specversion: Literal["1.0"]
    id: NonEmpty
    source: NonEmpty
    time: Timestamp
    subject: NonEmpty
    datacontenttype: Literal["application/json"]
    dataschema: Literal["https://maintenancebridge.io/schemas/maintenance-event/v1.json"]
    traceparent: TraceParent | None = None


def _typed(event_type: str, model: type[EventData]) -> type[_Typed]:
    """The `_Typed` of `event_type`, whose `data` is `model`."""
    typed = msgspec.defstruct(
        "_Typed", [("data", model)], bases=(_Typed,), tag=event_type, frozen=True, kw_only=True
    )
    return cast(type[_Typed], typed)


_ENVELOPE: Final = msgspec.json.Decoder(_Envelope)
_DECODERS: Final = {t: msgspec.json.Decoder(model) for t, model in DATA_TYPES.items()}
#: The event type of each member of `_TYPED`.
_TYPES: Final[Mapping[type[_Typed], str]] = {_typed(t, m): t for t, m in DATA_TYPES.items()}
#: Every known type's envelope and data in one pass (a union tagged by `type`): what a
#: valid event costs. An invalid one is decoded again by `_envelope_then_data`, whose
#: reasons name what is wrong (this union's would say little more than "invalid type").
_TYPED: Final[msgspec.json.Decoder[Any]] = msgspec.json.Decoder(
    functools.reduce(operator.or_, _TYPES)
)
#: The status each maintenance type's data must have.
_STATUS: Final[Mapping[str, str]] = {t: t.removeprefix(TYPE_PREFIX) for t in MAINTENANCE_TYPES}
_BATCH: Final = msgspec.json.Decoder(list[msgspec.Raw])
_ENCODER: Final = msgspec.json.Encoder()


def _reason(exc: msgspec.ValidationError | msgspec.DecodeError) -> str:
    return str(exc).replace("`$.", "`")


def from_cloudevent(value: bytes | str | Mapping[str, Any]) -> Event:
    """A structured-mode JSON CloudEvent (bytes, text or an already parsed dict) as a typed
    `Event`; raises `ContractError` when it is not valid against schema v1.

    One pass (`_TYPED`) decodes a valid event; whatever it refuses is decoded again the
    long way (`_envelope_then_data`), for the reason. The one pass accepts no more than the
    long way: the same fields with the same constraints, and where a key repeats, it
    checks each value where the long way keeps the last (a `type` that changes fails it)."""
    body = value if isinstance(value, bytes | str) else _ENCODER.encode(value)
    try:
        typed = _TYPED.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return _envelope_then_data(body)
    event_type = _TYPES[type(typed)]
    data = typed.data
    status = _STATUS.get(event_type)
    if status is not None and data.status != status:
        raise ContractError(f"{event_type}: data.status is {data.status!r}")
    return Event(
        id=typed.id,
        source=typed.source,
        type=event_type,
        subject=typed.subject,
        time=typed.time,
        data=data,
        traceparent=typed.traceparent,
    )


def _envelope_then_data(body: bytes | str) -> Event:
    """`from_cloudevent` in two steps, the attributes then `data` as its type says: slower
    than the one pass, but its `ContractError` names the reason."""
    try:
        envelope = _ENVELOPE.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ContractError(f"not a CloudEvent of schema v1: {_reason(exc)}") from None
    decoder = _DECODERS.get(envelope.type)
    if decoder is None:
        raise ContractError(f"unknown event type {envelope.type!r}")
    try:
        data = decoder.decode(envelope.data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ContractError(f"{envelope.type}: data: {_reason(exc)}") from None
    if (
        isinstance(data, MaintenanceData)
        and envelope.type in MAINTENANCE_TYPES
        and envelope.type != TYPE_PREFIX + data.status
    ):
        raise ContractError(f"{envelope.type}: data.status is {data.status!r}")
    return Event(
        id=envelope.id,
        source=envelope.source,
        type=envelope.type,
        subject=envelope.subject,
        time=envelope.time,
        data=data,
        traceparent=envelope.traceparent,
    )


def split_batch(body: bytes | str) -> list[bytes]:
    """The events of a CloudEvents JSON batch (`application/cloudevents-batch+json`), each
    as the exact bytes it had in the batch (so an audit log can keep them as received)."""
    try:
        return [bytes(item) for item in _BATCH.decode(body)]
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ContractError(f"not a JSON array of CloudEvents: {_reason(exc)}") from None


def binary_to_structured(headers: Mapping[str, str], body: bytes) -> bytes:
    """A binary-mode HTTP message (`ce-*` headers, data as the body) as structured JSON.

    Header names are matched case-insensitively; values are percent-decoded as the
    CloudEvents HTTP binding says. The result still goes through `from_cloudevent`.
    """
    attributes: dict[str, Any] = {}
    for name, value in headers.items():
        lowered = name.lower()
        if lowered.startswith("ce-") and len(lowered) > 3:
            attributes[lowered[3:]] = unquote(value)
    content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    attributes["datacontenttype"] = content_type.split(";")[0].strip() or CONTENT_TYPE
    try:
        attributes["data"] = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise ContractError(f"the body is not JSON: {_reason(exc)}") from None
    except (RecursionError, UnicodeDecodeError) as exc:
        raise ContractError(f"the body is not JSON that can be read: {exc}") from None
    try:
        return _ENCODER.encode(attributes)
    except UnicodeEncodeError as exc:  # a ce-* header that is not text
        raise ContractError(f"a ce-* header is not UTF-8: {exc.reason}") from None


def encode(event: Event) -> bytes:
    """The bytes of `event`: every event the sidecar writes (spool, sinks, a hook's stdin, the
    status API, `demo`) is written here, in one JSON form.

    The form: compact JSON (no spaces) of the attributes in one order (`specversion`, `id`,
    `source`, `type`, `subject`, `time`, `datacontenttype`, `dataschema`, `traceparent` when
    set), then `data` in its Struct's field order; every timestamp RFC 3339, `time` in UTC
    with a `Z`; non-ASCII characters and DEL as `\\u` escapes, as the events always had
    them. msgspec writes it in one call; an event with such characters is written by the
    standard library, which escapes them at C speed (its one other difference: a float's
    exponent, `1e-07` for msgspec's `1e-7`). A hook's output tail, the one field of arbitrary
    text, is looked at first, so such an event is not encoded twice.
    tests/test_typed_bytes.py pins the bytes.
    """
    event = _in_utc(event)
    data = event.data
    if not isinstance(data, HookCompletedData) or data.output_tail.isascii():
        body = _ENCODER.encode(event)
        if body.isascii() and b"\x7f" not in body:
            return body
    return _ESCAPING.encode(msgspec.to_builtins(event)).encode()


#: The standard library's compact writer, made once (`json.dumps` with `separators` builds a
#: new encoder on every call).
_ESCAPING: Final = json.JSONEncoder(separators=(",", ":"))


def to_dict(event: Event) -> dict[str, Any]:
    """The event as the JSON object `encode` writes (the same keys in the same order)."""
    result: dict[str, Any] = msgspec.to_builtins(_in_utc(event))
    return result


def _in_utc(event: Event) -> Event:
    """`event` with its `time` in UTC (written with a `Z`), whatever offset it was read with."""
    if event.time.tzinfo is UTC:
        return event
    return msgspec.structs.replace(event, time=event.time.astimezone(UTC))


def zone_of(zone: str | None, location: str | None) -> str | None:
    """A VM's zone named so that it is unique across clouds and regions.

    GCE and AWS zones name their region already (`europe-west1-b`, `us-east-1a`); an Azure
    zone is `1`, `2` or `3` within the VM's region (`data.instance.zone` keeps it as IMDS
    reported it), so zone 2 of two regions would be one zone. It becomes `<location>-<zone>`
    (`eastus-2`), as Kubernetes labels Azure nodes, and a VM without a zone is named by its
    region. The fleet files VMs under this name, and the budget's `group = "zone"` uses it
    with `zone_naming = "fleet"`: one function, so the two cannot disagree.
    """
    if zone and location and zone.isdigit():
        return f"{location}-{zone}"
    return zone or location


def rfc3339(value: datetime) -> str:
    """UTC RFC 3339 with a `Z`, as every timestamp of the contract."""
    text: str = msgspec.to_builtins(value.astimezone(UTC))
    return text


def epoch_rfc3339(seconds: float) -> str:
    """Unix seconds (how the fleet's store keeps times) as the contract writes times."""
    return rfc3339(datetime.fromtimestamp(seconds, UTC))
