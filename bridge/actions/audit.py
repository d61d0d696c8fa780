"""Audit events: what the bridge itself did about a notice, as CloudEvents of schema v1.

The bridge acts on notices (it runs hooks, it approves Azure events) and tells the same sinks
what it did, so whoever watches the maintenance also sees the reaction. Audit events share
the VM's `source` with its maintenance events, carry the notice id as `subject` (so a
consumer can join an approval to the notice it approved) and have deterministic ids, so a
commit retried after a failure never makes a second event. They go through the spool like
the notices: durably, at least once, to every sink.

They are built as typed values of the contract (`contract.ApprovedData`,
`contract.HookCompletedData`, `contract.BudgetReleasedData`, with `contract.BudgetData` and
`contract.HeldSlotData` from the budget), so they match schema v1 by construction; the spool
gets their bytes from `bridge.contract.encode`, as every event's (tests/test_typed_bytes.py).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal, TypedDict

from cloudevents.core.v1.event import CloudEvent

from bridge import contract
from bridge.infra.encoding import parse
from bridge.pipeline.events import instance_data, maintenance_trace, trace_context
from bridge.pipeline.model import Instance
from bridge.pipeline.typed_events import maintenance

HOOK_COMPLETED: Final = contract.HOOK_COMPLETED
APPROVED: Final = contract.APPROVED
TEST: Final = contract.TEST
BUDGET_RELEASED: Final = contract.BUDGET_RELEASED
BUDGET_UNRENEWED: Final = contract.BUDGET_UNRENEWED
HookOutcomeName = Literal["succeeded", "failed", "timed-out", "skipped", "interrupted"]
#: Who approves for a group (`approval.leader`, when it is not `none`).
Leader = Literal["sorted-first", "self"]
#: The output tail a hook.completed event carries, at most (the log gets more).
OUTPUT_TAIL_BYTES: Final = 4096

# Not the notices' namespace: an audit id can never collide with a notice's event id.
_AUDIT_NAMESPACE: Final = uuid.UUID("0d1f7c8e-3b52-4d8a-a6e1-59c2f4b7e903")


def _audit_id(*parts: str) -> str:
    return str(uuid.uuid5(_AUDIT_NAMESPACE, "\n".join(parts)))


class _TriggerFields(TypedDict):
    provider: contract.ProviderName
    instance: contract.InstanceData
    notice_id: str
    event_id: str
    event_type: str


@dataclass(frozen=True, slots=True)
class Trigger:
    """The maintenance event an action answered: what an audit event points back to (its
    `data` is the contract's `trigger`, the VM's `source` is the audit event's own)."""

    source: str
    data: contract.TriggerData

    @classmethod
    def of(cls, event: contract.Event) -> Trigger:
        """From the maintenance event the action answered."""
        data = maintenance(event)
        return cls(
            event.source,
            contract.TriggerData(
                provider=data.provider,
                instance=data.instance,
                notice_id=data.notice_id,
                event_id=event.id,
                event_type=event.type,
            ),
        )

    @property
    def notice_id(self) -> str:
        return self.data.notice_id

    @property
    def event_id(self) -> str:
        return self.data.event_id

    def _fields(self) -> _TriggerFields:
        """The trigger's fields, to start an audit payload with (the Structs' keywords)."""
        data = self.data
        return {
            "provider": data.provider,
            "instance": data.instance,
            "notice_id": data.notice_id,
            "event_id": data.event_id,
            "event_type": data.event_type,
        }


@dataclass(frozen=True, slots=True)
class HookOutcome:
    """How one hook run ended.

    `outcome` is `succeeded` (exit 0), `failed` (non-zero exit, or the command could not be
    started), `timed-out` (killed at its timeout or deadline), `skipped` (its deadline had
    passed before it could start) or `interrupted` (the bridge stopped or crashed while it
    ran; it is reported, never re-run).
    """

    hook: str
    outcome: HookOutcomeName
    exit_code: int | None
    duration_seconds: float
    output_tail: str
    error: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.outcome == "succeeded"


def _event(
    trigger: Trigger, type_: str, id_: str, at: datetime, data: contract.EventData
) -> contract.Event:
    """An audit event about `trigger`'s notice: the VM's source, the notice id as subject, in
    the maintenance's trace (the trace id its notice's events carry)."""
    return contract.Event(
        id=id_,
        source=trigger.source,
        type=type_,
        subject=trigger.notice_id,
        time=at.astimezone(UTC),
        traceparent=trace_context(maintenance_trace(trigger.source, trigger.notice_id), id_),
        data=data,
    )


def hook_completed(
    trigger: Trigger,
    run: HookOutcome,
    at: datetime,
    *,
    budget: contract.BudgetData | None = None,
) -> contract.Event:
    """`io.maintenancebridge.hook.completed` for one run of one hook on one transition.

    `budget`: for a hook marked `budget = true`, how taking its slot went (who, when).
    """
    tail = run.output_tail.encode()[-OUTPUT_TAIL_BYTES:].decode(errors="replace")
    data = contract.HookCompletedData(
        **trigger._fields(),
        hook=run.hook,
        outcome=run.outcome,
        exit_code=run.exit_code,
        timed_out=run.outcome == "timed-out",
        duration_seconds=round(run.duration_seconds, 3),
        output_tail=tail,
        error=run.error,
        budget=budget,
    )
    id_ = _audit_id(trigger.source, HOOK_COMPLETED, trigger.event_id, run.hook)
    return _event(trigger, HOOK_COMPLETED, id_, at, data)


def approved(
    trigger: Trigger,
    *,
    approved_by: str,
    rule: str,
    leader: Leader,
    at: datetime,
    budget: contract.BudgetData | None = None,
) -> contract.Event:
    """`io.maintenancebridge.maintenance.approved`: this VM sent StartRequests for the notice.

    One per notice and VM (the id ignores the transition), as the bridge approves an event
    at most once.
    """
    data = contract.ApprovedData(
        **trigger._fields(), approved_by=approved_by, rule=rule, leader=leader, budget=budget
    )
    id_ = _audit_id(trigger.source, APPROVED, trigger.notice_id)
    return _event(trigger, APPROVED, id_, at, data)


def budget_released(
    trigger: Trigger, budget: contract.HeldSlotData, at: datetime
) -> contract.Event:
    """`io.maintenancebridge.budget.released`: this VM gave its maintenance budget slot back
    (bridge/actions/coordination) because the notice that held it last ended (`trigger`: the
    completed or cancelled event). With the `budget` of the action that took it, who held
    a slot from when to when."""
    data = contract.BudgetReleasedData(**trigger._fields(), budget=budget)
    id_ = _audit_id(trigger.source, BUDGET_RELEASED, trigger.event_id)
    return _event(trigger, BUDGET_RELEASED, id_, at, data)


def budget_unrenewed(
    trigger: Trigger, budget: contract.UnrenewedSlotData, at: datetime
) -> contract.Event:
    """`io.maintenancebridge.budget.unrenewed`: this VM could not renew its budget slot's
    lease by its local deadline while `trigger`'s notice holds it (another member may take
    the slot once the lease expires; the maintenance goes on). One per notice and deadline."""
    data = contract.BudgetUnrenewedData(**trigger._fields(), budget=budget)
    id_ = _audit_id(
        trigger.source, BUDGET_UNRENEWED, trigger.notice_id, budget.unrenewed_at.isoformat()
    )
    return _event(trigger, BUDGET_UNRENEWED, id_, at, data)


def test_event(
    instance: Instance,
    message: str,
    at: datetime | None = None,  # noqa: PT028 (not a test: it builds the test event)
) -> CloudEvent:
    """`io.maintenancebridge.test`: a harmless event that proves the sinks are reachable.

    Each call is a new event (the id includes the time it was sent). A CloudEvent, as it
    goes straight to a sink (`doctor --send-test-event`), not through the spool.
    """
    sent_at = (at or datetime.now(UTC)).astimezone(UTC)
    id_ = _audit_id(instance.source, TEST, message, contract.rfc3339(sent_at))
    typed = contract.Event(
        id=id_,
        source=instance.source,
        type=TEST,
        subject=instance.name,
        time=sent_at,
        traceparent=trace_context(id_, id_),  # a trace of its own
        data=contract.TestData(
            provider=instance.provider.value,
            instance=instance_data(instance),
            message=message,
            sent_at=sent_at,
        ),
    )
    return parse(contract.encode(typed))


test_event.__test__ = False  # type: ignore[attr-defined]  # pytest must not collect it
