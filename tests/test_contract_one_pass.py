"""`from_cloudevent` decodes a valid event in one pass (a union tagged by `type`) and an
invalid one again the long way (`_envelope_then_data`: the attributes, then `data` as the
type says), for its reason. The contract is public, so the one pass must change nothing a
consumer sees: whatever the bytes, it gives the event the long way gives, or the same
refusal with the same reason."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge import contract
from tests.contract_samples import every_type

SAMPLES = every_type()


def _outcome(read: Any, body: bytes) -> tuple[str, object]:
    try:
        return "event", read(body)
    except contract.ContractError as exc:
        return "refused", str(exc)


@pytest.mark.parametrize("event_type", sorted(SAMPLES))
def test_every_type_the_sidecar_writes_is_read_in_one_pass(event_type: str) -> None:
    body = SAMPLES[event_type]
    contract._TYPED.decode(body)  # the fast path is the one taken, not the fallback
    event = contract.from_cloudevent(body)
    assert event == contract._envelope_then_data(body)
    assert type(event) is contract.Event
    assert event.type == event_type
    assert contract.encode(event) == body


class Pairs(list[tuple[str, Any]]):
    """A JSON object as its key-value pairs, in order: it may repeat a key, as JSON text can."""


def _pairs(value: Any) -> Any:
    if isinstance(value, dict):
        return Pairs((key, _pairs(item)) for key, item in value.items())
    if isinstance(value, list):
        return [_pairs(item) for item in value]
    return value


def _text(value: Any) -> str:
    if isinstance(value, Pairs):
        return "{" + ",".join(f"{json.dumps(k)}:{_text(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_text(item) for item in value) + "]"
    return json.dumps(value)


def _objects(value: Any) -> list[Pairs]:
    """Every JSON object in `value`, outermost first."""
    found: list[Pairs] = []
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, Pairs):
            found.append(node)
            stack.extend(item for _, item in node)
        elif isinstance(node, list):
            stack.extend(node)
    return found


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=6,
)
#: Values that are valid somewhere in an event, so a mutation can also make another valid one.
LIKELY = st.sampled_from(
    [
        *contract.DATA_TYPES,
        "io.example.other",
        "",
        "2026-11-21T12:00:00Z",
        "2026-11-21T12:00:00+05:30",
        "2026-11-21T12:00:00",
        "1.0",
        "gce",
        "azure",
        "scheduled",
        "completed",
        0,
        -1,
        1.5,
    ]
)
KEYS = st.sampled_from(
    ["type", "data", "time", "id", "source", "status", "instance", "provider", "traceparent"]
)
MUTATION = st.tuples(
    st.sampled_from(["set", "delete", "repeat first", "repeat last"]),
    st.integers(min_value=0),  # which object
    st.integers(min_value=0),  # which of its keys
    KEYS,
    LIKELY | JSON,
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    event_type=st.sampled_from(sorted(SAMPLES)),
    mutations=st.lists(MUTATION, min_size=1, max_size=3),
)
def test_the_one_pass_reads_any_bytes_as_the_long_way_does(
    event_type: str, mutations: list[tuple[str, int, int, str, Any]]
) -> None:
    """Keys set, deleted or repeated (JSON text may hold a key twice: the long way keeps
    the last value, the one pass checks each, so a repeated `type` that differs sends the
    event the long way): the same event or the same reason."""
    event = _pairs(json.loads(SAMPLES[event_type]))
    for action, which, index, key, value in mutations:
        objects = _objects(event)
        target = objects[which % len(objects)]
        if action == "set" and target:
            name, _ = target[index % len(target)]
            target[index % len(target)] = (name, _pairs(value))
        elif action == "delete" and target:
            del target[index % len(target)]
        elif action == "repeat first":
            target.insert(0, (key, _pairs(value)))
        else:
            target.append((key, _pairs(value)))
    body = _text(event).encode()
    assert _outcome(contract.from_cloudevent, body) == _outcome(contract._envelope_then_data, body)


@pytest.mark.parametrize(
    ("first", "last"),
    [(contract.HEARTBEAT, contract.SCHEDULED), (contract.SCHEDULED, contract.SCHEDULED)],
)
def test_a_repeated_type_reads_as_its_last_value_as_before(first: str, last: str) -> None:
    """The long way (the contract's reading since v1) keeps a repeated key's last value."""
    body = SAMPLES[contract.SCHEDULED]
    repeated = b'{"type":"' + first.encode() + b'",' + body[1:]
    event = contract.from_cloudevent(repeated)
    assert event.type == last
    assert event == contract.from_cloudevent(body)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"type": 5}', "not a CloudEvent of schema v1: Expected `str`, got `int` - at `type`"),
        (
            SAMPLES[contract.HEARTBEAT].replace(b"heartbeat", b"heartbeats"),
            "unknown event type 'io.maintenancebridge.agent.heartbeats'",
        ),
        (
            SAMPLES[contract.HEARTBEAT].replace(b'"spool_depth":0', b'"spool_depth":-1'),
            "io.maintenancebridge.agent.heartbeat: data: Expected `int` >= 0 - at `spool_depth`",
        ),
        (
            SAMPLES[contract.STARTED].replace(b'"status":"started"', b'"status":"completed"'),
            "io.maintenancebridge.maintenance.started: data.status is 'completed'",
        ),
    ],
)
def test_refusals_name_the_reason_they_always_named(body: bytes, reason: str) -> None:
    with pytest.raises(contract.ContractError) as caught:
        contract.from_cloudevent(body)
    assert str(caught.value) == reason
