"""Events of several VMs for the fleet tests, written by the sidecar's own writers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bridge import contract
from bridge.actions import audit
from bridge.fleet.store import Accepted, Batch
from bridge.pipeline.events import serialize, to_cloudevent
from bridge.pipeline.heartbeat import heartbeat_event
from bridge.pipeline.model import Instance, Kind, Notice, Provider, Status
from tests.factories import instance

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def gce_vm(name: str, zone: str = "us-central1-a") -> Instance:
    return instance(name, zone, "fleet-project")


def azure_vm(
    name: str,
    group: str = "fleet-rg",
    scale_set: str | None = None,
    zone: str | None = "1",
    location: str = "westeurope",
) -> Instance:
    resource = (
        "/subscriptions/8c56d827-5f07-45ce-8f2b-6c5001db5c6f/resourceGroups/"
        f"{group}/providers/Microsoft.Compute/virtualMachines/{name}"
    )
    return Instance(
        provider=Provider.AZURE,
        id=f"vm-{name}",
        name=name,
        source=resource,
        resource_id=resource,
        zone=zone,
        location=location,
        subscription="8c56d827-5f07-45ce-8f2b-6c5001db5c6f",
        resource_group=group,
        scale_set=scale_set,
    )


def transition(
    vm: Instance,
    notice_id: str,
    status: Status,
    at: datetime,
    kind: Kind = Kind.REBOOT,
    not_before: datetime | None = None,
    revision: str = "",
) -> bytes:
    """The structured JSON bytes of one maintenance transition (`revision`: another
    announcement of the same status, with an event id of its own)."""
    notice = Notice(
        instance=vm,
        kind=kind,
        status=status,
        notice_id=notice_id,
        observed_at=at,
        revision=revision,
        not_before=not_before,
        affected=(vm.name,),
    )
    return serialize(to_cloudevent(notice))


def heartbeat(vm: Instance, at: datetime, interval: float = 60.0, sequence: int = 0) -> bytes:
    event = heartbeat_event(
        vm,
        sequence=sequence,
        started_at=T0,
        interval=interval,
        watcher_healthy=True,
        spool_depth=0,
        at=at,
    )
    return contract.encode(event)


def hook_run(scheduled: bytes, at: datetime) -> bytes:
    trigger = audit.Trigger.of(contract.from_cloudevent(scheduled))
    run = audit.HookOutcome("drain", "succeeded", 0, 1.5, "drained")
    return contract.encode(audit.hook_completed(trigger, run, at))


def approval(scheduled: bytes, at: datetime) -> bytes:
    trigger = audit.Trigger.of(contract.from_cloudevent(scheduled))
    approved = audit.approved(trigger, approved_by="vm", rule="preset", leader="self", at=at)
    return contract.encode(approved)


def batch(*bodies: bytes, ingest: str = "http", received: datetime | None = None) -> Batch:
    when = (received or T0 + timedelta(hours=1)).timestamp()
    return Batch(
        ingest=ingest,
        received_at=when,
        accepted=[Accepted(contract.from_cloudevent(body), body) for body in bodies],
    )
