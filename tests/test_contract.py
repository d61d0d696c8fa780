"""The typed contract (bridge/contract.py) against the published JSON Schema and the writers.

The Structs and `schemas/maintenance-event.v1.json` describe the same events twice; these
tests make them agree property by property, check that everything the sidecar writes reads
back unchanged, and that what the schema refuses the contract refuses too.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any

import jsonschema
import msgspec
import pytest

from bridge import contract
from bridge.actions import audit
from bridge.contract import ContractError, from_cloudevent
from bridge.pipeline.events import EVENT_TYPES, as_dict, schema, serialize, to_cloudevent, to_event
from bridge.pipeline.model import Kind, Notice, Status, Window
from tests.factories import GCE_VM, sample_events, sample_notices
from tests.support import assert_valid

AT = datetime(2026, 11, 21, 12, 0, 5, tzinfo=UTC)


def _properties(definition: dict[str, Any], defs: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(all properties, required ones) of a `$def`, following its `allOf` references."""
    names = set(definition.get("properties", {}))
    required = set(definition.get("required", []))
    for part in definition.get("allOf", []):
        ref = part["$ref"].removeprefix("#/$defs/")
        more, more_required = _properties(defs[ref], defs)
        names |= more
        required |= more_required
    return names, required


@pytest.mark.parametrize(
    ("model", "name"), list(contract.SCHEMA_DEFS.items()), ids=list(contract.SCHEMA_DEFS.values())
)
def test_every_schema_def_matches_its_struct(model: type[msgspec.Struct], name: str) -> None:
    defs = schema()["$defs"]
    properties, required = _properties(defs[name], defs)
    info = msgspec.inspect.type_info(model)
    assert isinstance(info, msgspec.inspect.StructType)
    fields = {f.name for f in info.fields}
    without_default = {f.name for f in info.fields if f.required}
    assert fields == properties, f"$defs/{name} and {model.__name__} differ"
    assert without_default == required, f"required keys of $defs/{name} differ"


def _literal_values(field_type: msgspec.inspect.Type) -> set[object] | None:
    """The values a Literal field (or an optional one) allows; None when not a Literal."""
    if isinstance(field_type, msgspec.inspect.LiteralType):
        return set(field_type.values)
    if isinstance(field_type, msgspec.inspect.UnionType):
        values: set[object] = set()
        for member in field_type.types:
            if isinstance(member, msgspec.inspect.NoneType):
                values.add(None)
            elif isinstance(member, msgspec.inspect.LiteralType):
                values |= set(member.values)
            else:
                return None
        return values
    return None


@pytest.mark.parametrize(
    ("model", "name"), list(contract.SCHEMA_DEFS.items()), ids=list(contract.SCHEMA_DEFS.values())
)
def test_every_enum_of_the_schema_is_the_literal_of_its_struct(
    model: type[msgspec.Struct], name: str
) -> None:
    """A provider, kind or outcome added to the schema must be added to the contract too."""
    defs = schema()["$defs"]
    properties = dict(defs[name].get("properties", {}))
    for part in defs[name].get("allOf", []):
        properties.update(defs[part["$ref"].removeprefix("#/$defs/")].get("properties", {}))
    info = msgspec.inspect.type_info(model)
    assert isinstance(info, msgspec.inspect.StructType)
    for field in info.fields:
        enum = properties.get(field.name, {}).get("enum")
        if enum is None:
            continue
        allowed = _literal_values(field.type)
        if allowed is not None and None in allowed and None not in enum:
            allowed.discard(None)  # optional in the Struct: absent, never null, on the wire
        assert allowed == set(enum), f"$defs/{name}.{field.name}"


def test_every_type_of_the_schema_has_a_data_struct_and_back() -> None:
    assert set(schema()["properties"]["type"]["enum"]) == set(contract.DATA_TYPES)


def test_the_maintenance_writer_keeps_its_bytes() -> None:
    """Event ids and bytes are forever: the writer's output for a fixed notice is pinned
    (changed once, to the one encoder's form: spacing and key order; the id is the same).
    The one other change is additive: the traceparent attribute after dataschema (issue 35);
    without it the bytes are the one encoder's form of the event before it."""
    body = contract.encode(to_event(sample_notices(1)[0]))
    assert b'"id":"925507df-f33b-5680-b1d3-0ff1e3c78e4d"' in body
    assert hashlib.sha256(body).hexdigest() == PINNED_SHA256, body.decode()
    added = f',"traceparent":"{PINNED_TRACEPARENT}"'.encode()
    assert body.count(added) == 1
    assert hashlib.sha256(body.replace(added, b"")).hexdigest() == PINNED_WITHOUT_TRACEPARENT


PINNED_SHA256 = "2b5707529eea599ef6794cceff0ef153a25a65539f39c9e955e74e6678ea3e25"
PINNED_TRACEPARENT = "00-e9319618a91e52b1a56f6d2a80abaa7d-0884116ed7df578a-01"
PINNED_WITHOUT_TRACEPARENT = "61a3fc0ae2fd47a4a4d0e0f5f54fcbfe5f1124f7c5dcb013552d544f417ac55b"


def test_every_transition_of_one_maintenance_shares_its_trace() -> None:
    """One trace per maintenance (follow it from the metadata service to the fleet), one span
    per transition; announced again, an event carries the same traceparent."""
    notices = sample_notices(3)
    parents = [str(to_cloudevent(n).get_extension("traceparent")) for n in notices]
    again = [str(to_cloudevent(n).get_extension("traceparent")) for n in notices]
    assert parents == again
    for parent in parents:
        assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", parent), parent
    by_notice: dict[str, set[str]] = {}
    for notice, parent in zip(notices, parents, strict=True):
        by_notice.setdefault(notice.notice_id, set()).add(parent.split("-")[1])
    assert all(len(traces) == 1 for traces in by_notice.values())
    assert len({parent.split("-")[2] for parent in parents}) == len(parents)


def _written_events() -> list[dict[str, Any]]:
    """One event of each type as the sidecar's own writers produce it."""
    scheduled = Notice(
        instance=GCE_VM,
        kind=Kind.TERMINATE,
        status=Status.SCHEDULED,
        notice_id="gce-window-1",
        observed_at=AT,
        window=Window(AT, None, AT),
        duration_seconds=30,
        can_reschedule=True,
    )
    maintenance = [as_dict(e) for e in sample_events(2)] + [as_dict(to_cloudevent(scheduled))]
    trigger = audit.Trigger.of(from_cloudevent(maintenance[0]))
    run = audit.HookOutcome("drain", "timed-out", None, 1.23456, "out", "killed")
    return [
        *maintenance,
        assert_valid(audit.hook_completed(trigger, run, AT)),
        assert_valid(
            audit.approved(trigger, approved_by="vm", rule="preset", leader="self", at=AT)
        ),
        as_dict(audit.test_event(GCE_VM, "hello", AT)),
    ]


@pytest.mark.parametrize("event", _written_events(), ids=lambda e: e["type"])
def test_what_the_sidecar_writes_reads_back_unchanged(event: dict[str, Any]) -> None:
    typed = from_cloudevent(json.dumps(event).encode())
    assert typed.type == event["type"]
    assert typed.instance.name == GCE_VM.name
    assert json.loads(contract.encode(typed)) == event
    assert from_cloudevent(event) == typed  # a parsed dict reads the same


def test_the_encoder_writes_valid_events() -> None:
    for event in _written_events():
        assert_valid(json.loads(contract.encode(from_cloudevent(event))))


def _maintenance() -> dict[str, Any]:
    return as_dict(sample_events(1)[0])


def _broken(**changes: Any) -> dict[str, Any]:
    event = _maintenance()
    for path, value in changes.items():
        node = event
        *parents, last = path.split("__")
        for key in parents:
            node = node[key]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value
    return event


_DELETE = object()
_VALIDATOR = jsonschema.Draft202012Validator(
    schema(), format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
)


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (_broken(type="io.example.other"), "unknown event type 'io.example.other'"),
        (_broken(specversion="0.3"), "specversion"),
        (_broken(id=""), "id"),
        (_broken(data__kind="explode"), "Invalid enum value 'explode' - at `kind`"),
        (_broken(data__status="completed"), "data.status is 'completed'"),
        (_broken(data__notice_id=_DELETE), "notice_id"),
        (_broken(data__duration_seconds=-1), "duration_seconds"),
        (_broken(data__instance__name=None), "instance.name"),
        (_broken(dataschema="https://example.com/v2.json"), "dataschema"),
    ],
)
def test_what_the_schema_refuses_the_contract_refuses(event: dict[str, Any], reason: str) -> None:
    assert not _VALIDATOR.is_valid(event)
    with pytest.raises(ContractError) as caught:
        from_cloudevent(event)
    assert reason in str(caught.value)


@pytest.mark.parametrize("time", ["yesterday", "2026-11-21T12:00:00", "2026-11-21"])
def test_times_must_be_rfc3339_with_an_offset(time: str) -> None:
    """The schema's `format: date-time` (an annotation the installed jsonschema does not
    assert without an extra package); the contract checks it."""
    with pytest.raises(ContractError, match="time"):
        from_cloudevent(_broken(time=time))


def test_unknown_fields_are_ignored_as_schema_v1_asks() -> None:
    event = _broken(extension="x", data__future_field=1)
    assert _VALIDATOR.is_valid(event)
    assert from_cloudevent(event).id == event["id"]


@pytest.mark.parametrize("body", [b"", b"{", b"[]", b"null", b'{"id": 1}'])
def test_garbage_is_a_contract_error_not_a_crash(body: bytes) -> None:
    with pytest.raises(ContractError):
        from_cloudevent(body)


def test_a_batch_splits_into_the_exact_bytes_of_each_event() -> None:
    bodies = [serialize(e) for e in sample_events(3)]
    assert contract.split_batch(b"[" + b",".join(bodies) + b"]") == bodies
    with pytest.raises(ContractError):
        contract.split_batch(b'{"not": "a batch"}')


def test_binary_mode_reads_as_the_same_event() -> None:
    from cloudevents.core.bindings.http import to_binary
    from cloudevents.core.formats.json import JSONFormat

    event = sample_events(1)[0]
    message = to_binary(event, JSONFormat())
    structured = contract.binary_to_structured(dict(message.headers), message.body)
    assert from_cloudevent(structured) == from_cloudevent(serialize(event))


def test_the_writers_types_are_the_contracts() -> None:
    """bridge/actions/audit.py names its types itself (the sidecar's writer); the contract must read
    every one of them, and the maintenance writer's."""
    assert (audit.APPROVED, audit.HOOK_COMPLETED, audit.TEST) == (
        contract.APPROVED,
        contract.HOOK_COMPLETED,
        contract.TEST,
    )
    audit_types = {audit.HOOK_COMPLETED, audit.APPROVED, audit.TEST, audit.BUDGET_RELEASED}
    assert audit_types <= set(contract.DATA_TYPES)
    assert set(EVENT_TYPES) == set(contract.MAINTENANCE_TYPES)
