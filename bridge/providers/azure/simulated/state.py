"""State of the simulated Azure Scheduled Events service and how the document is rendered.

Events carry their timeline in *simulated* seconds (when they start, when they vanish) and a
``NotBefore`` string frozen at creation: the wall-clock instant at which, at the speed then in
force, the event will start.  Freezing it keeps the documented contract that documents with the
same ``DocumentIncarnation`` are identical.  The incarnation moves on every change of
``Events`` and only then.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bridge.simulator.clock import SimClock, rfc1123

SCHEDULED_EVENTS_VERSIONS = (
    "2020-07-01",
    "2019-08-01",
    "2019-04-01",
    "2019-01-01",
    "2017-11-01",
    "2017-08-01",
)
EVENT_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")
EVENT_STATUSES = ("Scheduled", "Started")
EVENT_SOURCES = ("Platform", "User")
DEFAULT_STARTED_FOR = 300.0
"""Sim seconds a Started event stays listed when DurationInSeconds is -1 and nothing else
was said (Azure's mock server uses 5 to 10 minutes)."""

DEFAULT_DESCRIPTIONS = {
    "Freeze": "Virtual machine is being paused because of a memory-preserving Live Migration "
    "operation.",
    "Reboot": "Virtual machine is going to be restarted as requested by authorized user.",
    "Redeploy": "Virtual machine is going to be redeployed to another host.",
    "Preempt": "Virtual machine is being evicted (Spot capacity or price).",
    "Terminate": "Virtual machine is being deleted (scale-in).",
}
PLATFORM_DESCRIPTIONS = {
    "Reboot": "Host server is undergoing maintenance.",
    "Redeploy": "Virtual machine is being redeployed because the host is being serviced.",
}


_DEFAULT_SUBSCRIPTION = "8c56d827-5f07-45ce-8f2b-6c5001db5c6f"


@dataclass(frozen=True)
class AzureIdentity:
    name: str = "sim-vm-1"
    vm_id: str = "02aab8a4-74ef-476e-8182-f6d2ba4166a6"
    subscription_id: str = _DEFAULT_SUBSCRIPTION
    resource_group_name: str = "sim-rg"
    location: str = "westeurope"
    zone: str = "1"
    vm_scale_set_name: str = ""
    vm_size: str = "Standard_D2s_v3"
    os_type: str = "Linux"
    explicit_resource_id: str = ""
    tenant_id: str = "72f988bf-86f1-41af-91ab-2d7cd011db47"
    #: A managed identity is assigned: without one the token endpoint answers 400 "Identity
    #: not found" and only the attested document proves the VM.
    managed_identity: bool = True

    @property
    def resource_id(self) -> str:
        """ARM id of the VM, derived from subscription, group and name unless given."""
        if self.explicit_resource_id:
            return self.explicit_resource_id
        return (
            f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group_name}"
            f"/providers/Microsoft.Compute/virtualMachines/{self.name}"
        )


class AzureQuirks:
    """Behaviors that vary or are undocumented; switch them live."""

    def __init__(self) -> None:
        self.first_call_delay: float = 0.0
        """Real seconds the first scheduledevents call waits (the real service: up to 120 s)."""
        self.unknown_approval_status: int = 400
        """Status for a POST naming an unknown or finished EventId (undocumented; 400 default)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "first_call_delay": self.first_call_delay,
            "unknown_approval_status": self.unknown_approval_status,
        }

    def update(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            if key == "first_call_delay":
                self.first_call_delay = float(value)
            elif key == "unknown_approval_status":
                self.unknown_approval_status = int(value)
            else:
                raise ValueError(f"unknown Azure quirk {key!r}")


@dataclass
class AzureEvent:
    event_id: str
    event_type: str
    resources: list[str]
    status: str
    not_before: str
    description: str
    source: str
    duration: int
    starts_at: float | None
    """Sim time at which a Scheduled event auto-starts (its NotBefore)."""
    started_for: float | None
    """Sim seconds it stays listed once Started; None = until removed explicitly."""
    ends_at: float | None = None

    def render(self, api_version: str) -> dict[str, Any]:
        """One event in the field order of the vendor's example responses.

        Older api-versions omit the fields added later (Description 2019-04-01,
        EventSource 2019-08-01, DurationInSeconds 2020-07-01).
        """
        out: dict[str, Any] = {
            "EventId": self.event_id,
            "EventStatus": self.status,
            "EventType": self.event_type,
            "ResourceType": "VirtualMachine",
            "Resources": list(self.resources),
            "NotBefore": self.not_before,
        }
        if api_version >= "2019-04-01":
            out["Description"] = self.description
        if api_version >= "2019-08-01":
            out["EventSource"] = self.source
        if api_version >= "2020-07-01":
            out["DurationInSeconds"] = self.duration
        return out


@dataclass
class Approval:
    event_id: str
    client: str
    user_agent: str
    sim_time: float


@dataclass
class AzureState:
    identity: AzureIdentity
    clock: SimClock
    notify: Callable[[], None]
    incarnation: int = 1
    quirks: AzureQuirks = field(default_factory=AzureQuirks)
    approval_log: list[Approval] = field(default_factory=list)
    first_call_done: bool = False
    _events: list[AzureEvent] = field(default_factory=list)

    # -- read side --------------------------------------------------------------------------
    @property
    def events(self) -> list[dict[str, Any]]:
        """Current events exactly as served with the newest api-version."""
        return [e.render(SCHEDULED_EVENTS_VERSIONS[0]) for e in self._events]

    @property
    def approvals(self) -> list[str]:
        """EventIds approved by POST StartRequests, in order (see ``approval_log``)."""
        return [a.event_id for a in self.approval_log]

    def document(self, api_version: str) -> dict[str, Any]:
        return {
            "DocumentIncarnation": self.incarnation,
            "Events": [e.render(api_version) for e in self._events],
        }

    def find(self, event_id: str) -> AzureEvent | None:
        for event in self._events:
            if event.event_id.lower() == event_id.lower():
                return event
        return None

    # -- live driving --------------------------------------------------------------------
    def _changed(self) -> None:
        self.incarnation += 1
        self.notify()

    def add_event(
        self,
        event_id: str | None = None,
        event_type: str = "Freeze",
        resources: list[str] | None = None,
        status: str = "Scheduled",
        not_before_in: float = 900.0,
        description: str | None = None,
        source: str = "Platform",
        duration: int = -1,
        started_for: float | None = None,
        auto_complete: bool = True,
        *,
        at: float | None = None,
    ) -> str:
        """Publish an event; returns its EventId.

        ``not_before_in`` is in sim seconds from now (ignored when Started).  Once Started the
        event disappears after ``started_for`` sim seconds (default: DurationInSeconds when
        positive, else 5 min), unless ``auto_complete`` is False.  ``at`` is the sim time the
        event is created at (scenario steps firing late pass their due time).
        """
        if event_type not in EVENT_TYPES:
            raise ValueError(f"event_type must be one of {EVENT_TYPES}")
        if status not in EVENT_STATUSES:
            raise ValueError(f"status must be one of {EVENT_STATUSES}")
        if source not in EVENT_SOURCES:
            raise ValueError(f"source must be one of {EVENT_SOURCES}")
        now = self.clock.now() if at is None else at
        event_id = event_id or str(uuid.uuid4()).upper()
        if self.find(event_id) is not None:
            raise ValueError(f"event {event_id} already exists")
        if description is None:
            if source == "Platform" and event_type in PLATFORM_DESCRIPTIONS:
                description = PLATFORM_DESCRIPTIONS[event_type]
            else:
                description = DEFAULT_DESCRIPTIONS[event_type]
        if started_for is None:
            started_for = float(duration) if duration > 0 else DEFAULT_STARTED_FOR
        event = AzureEvent(
            event_id=event_id,
            event_type=event_type,
            resources=list(resources) if resources is not None else [self.identity.name],
            status=status,
            not_before="",
            description=description,
            source=source,
            duration=int(duration),
            starts_at=None,
            started_for=started_for if auto_complete else None,
        )
        if status == "Scheduled":
            event.starts_at = now + not_before_in
            event.not_before = rfc1123(self.clock.wall_time_of(event.starts_at))
        else:
            self._mark_started(event, now)
        self._events.append(event)
        self._changed()
        return event_id

    def _mark_started(self, event: AzureEvent, now: float) -> None:
        event.status = "Started"
        event.not_before = ""
        event.starts_at = None
        event.ends_at = None if event.started_for is None else now + event.started_for

    def start_event(self, event_id: str, *, at: float | None = None) -> bool:
        """Scheduled -> Started (NotBefore ""); returns False if it was already Started."""
        event = self.find(event_id)
        if event is None:
            raise KeyError(event_id)
        if event.status == "Started":
            return False
        self._mark_started(event, self.clock.now() if at is None else at)
        self._changed()
        return True

    def remove_event(self, event_id: str) -> None:
        """The event completed or was cancelled: it simply disappears."""
        event = self.find(event_id)
        if event is None:
            raise KeyError(event_id)
        self._events.remove(event)
        self._changed()

    def approve(self, event_ids: list[str], client: str, user_agent: str) -> bool:
        """Apply a POST StartRequests; False (and no change) if any id is unknown."""
        events = [self.find(i) for i in event_ids]
        if any(e is None for e in events):
            return False
        for event in events:
            assert event is not None
            self.approval_log.append(Approval(event.event_id, client, user_agent, self.clock.now()))
            if event.status == "Scheduled":
                self.start_event(event.event_id)
        return True

    # -- timeline ----------------------------------------------------------------------------
    def next_due(self) -> float | None:
        """Sim time of the next automatic transition, if any."""
        times = [e.starts_at for e in self._events if e.starts_at is not None]
        times += [e.ends_at for e in self._events if e.ends_at is not None]
        return min(times) if times else None

    def fire_due(self, until: float) -> str | None:
        """Run the next automatic transition if due by ``until``; describe what happened."""
        due = self.next_due()
        if due is None or due > until:
            return None
        for event in list(self._events):
            if event.starts_at is not None and event.starts_at == due:
                self.start_event(event.event_id, at=due)
                return (
                    f"azure: {event.event_type} {event.event_id} reached NotBefore: Started "
                    f"(incarnation {self.incarnation})"
                )
            if event.ends_at is not None and event.ends_at == due:
                self.remove_event(event.event_id)
                return (
                    f"azure: {event.event_type} {event.event_id} completed: removed "
                    f"(incarnation {self.incarnation})"
                )
        return None

    def snapshot(self) -> dict[str, Any]:
        return {
            "incarnation": self.incarnation,
            "events": self.events,
            "approvals": [a.__dict__ for a in self.approval_log],
            "quirks": self.quirks.as_dict(),
        }
