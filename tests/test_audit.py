"""Audit events: valid against schema v1, deterministic ids, joined to their notice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import jsonschema
import pytest

from bridge.actions import audit
from bridge.contract import from_cloudevent
from bridge.pipeline.events import serialize, to_cloudevent
from tests.factories import GCE_VM, sample_notices
from tests.support import assert_valid

AT = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def _trigger() -> audit.Trigger:
    return audit.Trigger.of(from_cloudevent(serialize(to_cloudevent(sample_notices(1)[0]))))


def _run(
    outcome: audit.HookOutcomeName = "succeeded", tail: str = "drained\n"
) -> audit.HookOutcome:
    return audit.HookOutcome("drain", outcome, 0 if outcome == "succeeded" else None, 1.5, tail)


def test_hook_completed_is_valid_and_points_at_its_notice() -> None:
    trigger = _trigger()
    event = assert_valid(audit.hook_completed(trigger, _run(), AT))
    assert event["type"] == "io.maintenancebridge.hook.completed"
    assert event["source"] == GCE_VM.source
    assert event["subject"] == trigger.notice_id
    assert event["data"]["event_id"] == trigger.event_id
    assert event["data"]["outcome"] == "succeeded"
    assert event["data"]["timed_out"] is False
    assert event["data"]["output_tail"] == "drained\n"


def test_hook_completed_id_is_stable_across_retries_and_distinct_per_hook() -> None:
    trigger = _trigger()
    first = audit.hook_completed(trigger, _run(), AT)
    again = audit.hook_completed(trigger, _run(), AT + timedelta(seconds=5))
    other = audit.hook_completed(trigger, audit.HookOutcome("checkpoint", "failed", 1, 0, ""), AT)
    assert first.id == again.id
    assert other.id != first.id
    assert first.id != trigger.event_id


def test_output_tail_is_capped_to_the_last_4_kib() -> None:
    event = audit.hook_completed(_trigger(), _run(tail="x" * 10_000 + "END"), AT)
    tail = assert_valid(event)["data"]["output_tail"]
    assert len(tail.encode()) == audit.OUTPUT_TAIL_BYTES
    assert tail.endswith("END")


def test_timed_out_hook() -> None:
    event = assert_valid(audit.hook_completed(_trigger(), _run("timed-out"), AT))
    assert event["data"]["timed_out"] is True
    assert event["data"]["exit_code"] is None


def test_approved_is_valid_and_one_per_notice() -> None:
    trigger = _trigger()
    event = assert_valid(
        audit.approved(trigger, approved_by="sim-vm-1", rule="preset", leader="self", at=AT)
    )
    assert event["type"] == "io.maintenancebridge.maintenance.approved"
    assert event["subject"] == trigger.notice_id
    assert event["data"]["approved_by"] == "sim-vm-1"
    later = audit.approved(trigger, approved_by="sim-vm-1", rule="x", leader="self", at=AT)
    assert later.id == event["id"]


def test_test_event_is_valid_and_new_each_time() -> None:
    first = assert_valid(audit.test_event(GCE_VM, "hello", AT))
    second = audit.test_event(GCE_VM, "hello", AT + timedelta(seconds=1))
    assert first["type"] == "io.maintenancebridge.test"
    assert first["data"]["message"] == "hello"
    assert first["data"]["sent_at"] == "2026-11-21T12:00:00Z"
    assert second.get_id() != first["id"]


def test_schema_still_rejects_a_maintenance_event_with_an_audit_shape() -> None:
    event = assert_valid(audit.hook_completed(_trigger(), _run(), AT))
    event["type"] = "io.maintenancebridge.maintenance.started"
    with pytest.raises(jsonschema.ValidationError):
        assert_valid(event)


def test_schema_rejects_an_unknown_hook_outcome() -> None:
    event = assert_valid(audit.hook_completed(_trigger(), _run(), AT))
    event["data"]["outcome"] = "maybe"
    with pytest.raises(jsonschema.ValidationError):
        assert_valid(event)
