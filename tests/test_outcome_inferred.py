"""`data.outcome_inferred` was added to the contract additively.

A maintenance event says `outcome_inferred: true` when the watcher concluded the outcome
(an Azure event that vanished unseen after its NotBefore ran) rather than saw it. Every event
written before keeps its bytes and validates; one with the field validates against the
schema as it was before too (old consumers ignore it); the typed contract reads it and writes
it back where the sidecar wrote it. The frozen "before" schema is in tests/fixtures/schema.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema

from bridge import contract
from bridge.pipeline.events import as_dict, schema, serialize, to_cloudevent
from bridge.pipeline.model import Kind, Notice, Status
from tests.factories import sample_events, sample_notices
from tests.support import assert_valid

BEFORE = Path(__file__).parent / "fixtures" / "schema"
OLD_SCHEMA: dict[str, Any] = json.loads(
    (BEFORE / "maintenance-event.v1.before-outcome-inferred.json").read_text()
)
OLDER_EVENTS = (BEFORE / "events-before-aws.jsonl").read_text().splitlines()


def _inferred() -> Notice:
    scheduled = sample_notices(1)[0]
    return dataclasses.replace(
        scheduled, kind=Kind.FREEZE, status=Status.COMPLETED, outcome_inferred=True
    )


def test_the_schema_change_only_adds_an_optional_property() -> None:
    # Additive: every definition and property of before stays, none becomes required (later
    # changes add definitions of their own, e.g. budget_unrenewed, and that is additive too).
    old, new = OLD_SCHEMA["$defs"], schema()["$defs"]
    assert set(old) <= set(new)
    for name, definition in old.items():
        assert new[name].get("required") == definition.get("required"), name
        assert set(definition.get("properties", {})) <= set(new[name].get("properties", {}))
    added = set(new["maintenance"]["properties"]) - set(old["maintenance"]["properties"])
    assert added == {"outcome_inferred"}
    assert new["maintenance"]["properties"]["outcome_inferred"]["type"] == "boolean"


def test_every_earlier_event_still_validates_and_reads_as_seen() -> None:
    for line in OLDER_EVENTS:
        event = json.loads(line)
        assert_valid(event)
        typed = contract.from_cloudevent(line)
        if isinstance(typed.data, contract.MaintenanceData):
            assert typed.data.outcome_inferred is False
            # written back without the field: the bytes a hook or a sink saw do not change
            data = contract.to_dict(typed)["data"]
            assert isinstance(data, dict)
            assert "outcome_inferred" not in data


def test_events_without_an_inferred_outcome_keep_their_bytes() -> None:
    for event in sample_events(3):
        assert b"outcome_inferred" not in serialize(event)


def test_an_inferred_outcome_validates_old_and_new_and_reads_back_byte_for_byte() -> None:
    body = serialize(to_cloudevent(_inferred()))
    event = as_dict(to_cloudevent(_inferred()))
    assert event["data"]["outcome_inferred"] is True
    assert list(event["data"])[-1] == "outcome_inferred"  # after `raw`, as the Struct writes it
    assert_valid(event)
    jsonschema.Draft202012Validator(
        OLD_SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    ).validate(event)  # a consumer on the old schema accepts it (and ignores the field)
    typed = contract.from_cloudevent(body)
    assert isinstance(typed.data, contract.MaintenanceData)
    assert typed.data.outcome_inferred is True
    assert contract.encode(typed) == body
