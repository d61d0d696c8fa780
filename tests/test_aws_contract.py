"""Adding AWS changed the public contract additively only (provider `aws`, optional
instance fields), and every event produced before the change still validates.

The frozen "before" schema and events are in tests/fixtures/schema (see its README).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from bridge.pipeline.events import parse, schema, serialize, to_cloudevent
from bridge.pipeline.model import Kind, Notice, Status
from bridge.providers.aws.watcher import instance_of
from tests.factories import sample_events
from tests.support import assert_valid

BEFORE = Path(__file__).parent / "fixtures" / "schema"
OLD_SCHEMA: dict[str, Any] = json.loads(
    (BEFORE / "maintenance-event.v1.before-aws.json").read_text()
)
OLD_EVENTS = (BEFORE / "events-before-aws.jsonl").read_text().splitlines()


def old_validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        OLD_SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


@pytest.mark.parametrize("line", OLD_EVENTS)
def test_every_event_produced_before_aws_still_validates(line: str) -> None:
    event = json.loads(line)
    old_validator().validate(event)  # it was valid then ...
    assert_valid(event)  # ... and is valid now


def test_events_of_the_other_providers_are_produced_byte_for_byte_as_before() -> None:
    """The same events, in the one encoder's form since it replaced the SDK's JSON (the
    same attribute order, no spaces: the old bytes read back and written today give today's
    bytes; tests/test_typed_bytes.py pins them), and the one additive attribute since
    (traceparent, issue 35)."""
    before = [line for line in OLD_EVENTS if '"gce-episode-' in line]
    now = [serialize(event).decode() for event in sample_events(2)]
    added = re.compile(r',"traceparent":"00-[0-9a-f]{32}-[0-9a-f]{16}-01"')
    assert [len(added.findall(line)) for line in now] == [1] * len(now)
    assert [added.sub("", line) for line in now] == [
        serialize(parse(line)).decode() for line in before
    ]


def _definitions(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {"(root)": document, **document["$defs"]}


def _enums(node: Any, path: str = "") -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    if isinstance(node, dict):
        if "enum" in node:
            found[path] = node["enum"]
        for key, value in node.items():
            found |= _enums(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            # An if/then rule is named by its condition, not its place: other additions may
            # insert rules before it.
            is_rule = isinstance(value, dict) and "if" in value
            name = json.dumps(value["if"], sort_keys=True) if is_rule else str(index)
            found |= _enums(value, f"{path}/{name}")
    return found


def test_the_schema_change_is_additive() -> None:
    old, new = _definitions(OLD_SCHEMA), _definitions(schema())
    assert set(old) <= set(new)
    for name, definition in old.items():
        assert new[name].get("required") == definition.get("required"), name
        assert set(definition.get("properties", {})) <= set(new[name].get("properties", {}))
    new_enums = _enums(schema())
    for path, values in _enums(OLD_SCHEMA).items():
        assert set(values) <= set(new_enums[path]), path


def test_an_aws_event_is_valid_now_and_was_not_before() -> None:
    instance = instance_of(
        {
            "accountId": "123456789012",
            "instanceId": "i-1234567890abcdef0",
            "region": "eu-west-1",
            "availabilityZone": "eu-west-1a",
            "instanceType": "c6i.large",
        }
    )
    notice = Notice(
        instance=instance,
        kind=Kind.PREEMPT,
        status=Status.STARTED,
        notice_id="aws-spot-0123456789abcdef01234567",
        observed_at=datetime(2026, 11, 23, 12, 0, tzinfo=UTC),
    )
    event = assert_valid(to_cloudevent(notice))
    assert event["data"]["instance"]["account"] == "123456789012"
    with pytest.raises(jsonschema.ValidationError, match="'aws' is not one of"):
        old_validator().validate(event)
