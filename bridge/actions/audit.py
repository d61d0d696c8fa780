"""Audit events: what the bridge itself did about a notice, as CloudEvents of schema v1.

The bridge acts on notices (it runs hooks, it approves Azure events) and tells the same sinks
what it did, so whoever watches the maintenance also sees the reaction. Audit events share
the VM's `source` with its maintenance events, carry the notice id as `subject` (so a
consumer can join an approval to the notice it approved) and have deterministic ids, so a
commit retried after a failure never makes a second event. They go through the spool like
the notices: durably, at least once, to every sink.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from cloudevents.core.v1.event import CloudEvent

from bridge.pipeline.events import CONTENT_TYPE, SCHEMA_URI, rfc3339
from bridge.pipeline.model import Instance

HOOK_COMPLETED: Final = "io.maintenancebridge.hook.completed"
APPROVED: Final = "io.maintenancebridge.maintenance.approved"
TEST: Final = "io.maintenancebridge.test"
BUDGET_RELEASED: Final = "io.maintenancebridge.budget.released"
#: The output tail a hook.completed event carries, at most (the log gets more).
OUTPUT_TAIL_BYTES: Final = 4096

# Not the notices' namespace: an audit id can never collide with a notice's event id.
_AUDIT_NAMESPACE: Final = uuid.UUID("0d1f7c8e-3b52-4d8a-a6e1-59c2f4b7e903")


def _audit_id(*parts: str) -> str:
    return str(uuid.uuid5(_AUDIT_NAMESPACE, "\n".join(parts)))


@dataclass(frozen=True, slots=True)
class Trigger:
    """The maintenance event an action answered: what an audit event points back to."""

    source: str
    provider: str
    instance: dict[str, Any]
    notice_id: str
    event_id: str
    event_type: str

    @classmethod
    def of(cls, event: dict[str, Any]) -> Trigger:
        """From a maintenance event as consumers see it (`bridge.pipeline.events.as_dict`)."""
        data = event["data"]
        return cls(
            source=event["source"],
            provider=data["provider"],
            instance=data["instance"],
            notice_id=data["notice_id"],
            event_id=event["id"],
            event_type=event["type"],
        )

    def as_data(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "instance": self.instance,
            "notice_id": self.notice_id,
            "event_id": self.event_id,
            "event_type": self.event_type,
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
    outcome: str
    exit_code: int | None
    duration_seconds: float
    output_tail: str
    error: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.outcome == "succeeded"


def _event(attributes: dict[str, Any], data: dict[str, Any]) -> CloudEvent:
    base: dict[str, Any] = {
        "specversion": "1.0",
        "datacontenttype": CONTENT_TYPE,
        "dataschema": SCHEMA_URI,
    }
    return CloudEvent({**base, **attributes}, data)


def hook_completed(
    trigger: Trigger, run: HookOutcome, at: datetime, *, budget: dict[str, Any] | None = None
) -> CloudEvent:
    """`io.maintenancebridge.hook.completed` for one run of one hook on one transition.

    `budget`: for a hook marked `budget = true`, how taking its slot went (who, when).
    """
    tail = run.output_tail.encode()[-OUTPUT_TAIL_BYTES:].decode(errors="replace")
    return _event(
        {
            "id": _audit_id(trigger.source, HOOK_COMPLETED, trigger.event_id, run.hook),
            "source": trigger.source,
            "type": HOOK_COMPLETED,
            "subject": trigger.notice_id,
            "time": at.astimezone(UTC),
        },
        {
            **trigger.as_data(),
            "hook": run.hook,
            "outcome": run.outcome,
            "exit_code": run.exit_code,
            "timed_out": run.outcome == "timed-out",
            "duration_seconds": round(run.duration_seconds, 3),
            "output_tail": tail,
            "error": run.error,
            **({"budget": budget} if budget is not None else {}),
        },
    )


def approved(
    trigger: Trigger,
    *,
    approved_by: str,
    rule: str,
    leader: str,
    at: datetime,
    budget: dict[str, Any] | None = None,
) -> CloudEvent:
    """`io.maintenancebridge.maintenance.approved`: this VM sent StartRequests for the notice.

    One per notice and VM (the id ignores the transition), as the bridge approves an event
    at most once.
    """
    return _event(
        {
            "id": _audit_id(trigger.source, APPROVED, trigger.notice_id),
            "source": trigger.source,
            "type": APPROVED,
            "subject": trigger.notice_id,
            "time": at.astimezone(UTC),
        },
        {
            **trigger.as_data(),
            "approved_by": approved_by,
            "rule": rule,
            "leader": leader,
            **({"budget": budget} if budget is not None else {}),
        },
    )


def budget_released(trigger: Trigger, budget: dict[str, Any], at: datetime) -> CloudEvent:
    """`io.maintenancebridge.budget.released`: this VM gave its maintenance budget slot back
    (bridge/actions/coordination) because the notice that held it last ended (`trigger`: the
    completed or cancelled event). With the `budget` of the action that took it, who held
    a slot from when to when."""
    return _event(
        {
            "id": _audit_id(trigger.source, BUDGET_RELEASED, trigger.event_id),
            "source": trigger.source,
            "type": BUDGET_RELEASED,
            "subject": trigger.notice_id,
            "time": at.astimezone(UTC),
        },
        {**trigger.as_data(), "budget": budget},
    )


def test_event(
    instance: Instance,
    message: str,
    at: datetime | None = None,  # noqa: PT028 (not a test: it builds the test event)
) -> CloudEvent:
    """`io.maintenancebridge.test`: a harmless event that proves the sinks are reachable.

    Each call is a new event (the id includes the time it was sent).
    """
    sent_at = (at or datetime.now(UTC)).astimezone(UTC)
    stamp = rfc3339(sent_at)
    assert stamp is not None
    return _event(
        {
            "id": _audit_id(instance.source, TEST, message, stamp),
            "source": instance.source,
            "type": TEST,
            "subject": instance.name,
            "time": sent_at,
        },
        {
            "provider": instance.provider.value,
            "instance": instance.as_data(),
            "message": message,
            "sent_at": stamp,
        },
    )


test_event.__test__ = False  # type: ignore[attr-defined]  # pytest must not collect it
