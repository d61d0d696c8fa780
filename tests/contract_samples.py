"""One event of every type of the contract, each with every optional time it may carry set
(a window, a budget), written by the sidecar's own writers: what a test of every shape reads.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bridge import contract
from bridge.actions import audit
from bridge.pipeline.events import serialize, to_cloudevent
from bridge.pipeline.heartbeat import heartbeat_event
from bridge.pipeline.model import Kind, Notice, Status, Window
from tests.factories import GCE_VM

AT = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def every_type() -> dict[str, bytes]:
    """By type: the bytes of one event of that type (four maintenance statuses included)."""
    hour = timedelta(hours=1)
    notices = {
        status: Notice(
            instance=GCE_VM,
            kind=Kind.LIVE_MIGRATE,
            status=status,
            notice_id="n-1",
            observed_at=AT,
            not_before=AT + hour,
            window=Window(start=AT + hour, end=AT + 2 * hour, latest_start=AT + hour),
            affected=(GCE_VM.name,),
        )
        for status in Status
    }
    events = {
        contract.TYPE_PREFIX + status.value: serialize(to_cloudevent(notice))
        for status, notice in notices.items()
    }
    trigger = audit.Trigger.of(contract.from_cloudevent(events[contract.SCHEDULED]))
    budget = contract.BudgetData(
        group="zone", member="vm", outcome="acquired", waited_seconds=0.5, acquired_at=AT
    )
    run = audit.HookOutcome("drain", "succeeded", 0, 1.5, "drained")
    typed = [
        audit.hook_completed(trigger, run, AT, budget=budget),
        audit.approved(
            trigger, approved_by="vm", rule="preset", leader="self", at=AT, budget=budget
        ),
        audit.budget_released(
            trigger,
            contract.HeldSlotData(
                group="zone",
                member="vm",
                slot="1",
                acquired_at=AT,
                released_at=AT + hour,
                held_seconds=3600.0,
            ),
            AT + hour,
        ),
        audit.budget_unrenewed(
            trigger,
            contract.UnrenewedSlotData(
                group="zone",
                member="vm",
                slot="1",
                acquired_at=AT,
                unrenewed_at=AT + hour,
                lease_ttl_seconds=30.0,
                reason="etcd unreachable",
            ),
            AT + hour,
        ),
        heartbeat_event(
            GCE_VM,
            sequence=1,
            started_at=AT - hour,
            interval=60.0,
            watcher_healthy=True,
            spool_depth=0,
            at=AT,
        ),
    ]
    events.update({event.type: contract.encode(event) for event in typed})
    events[contract.TEST] = serialize(audit.test_event(GCE_VM, "hello", AT))
    assert set(events) == set(contract.DATA_TYPES), "a type of the contract has no sample"
    return events
