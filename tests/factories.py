"""Realistic events for sink and delivery tests, produced by the real normalizer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from cloudevents.core.v1.event import CloudEvent

from bridge.pipeline.events import to_cloudevent
from bridge.pipeline.model import Instance, Kind, Notice, Origin, Provider, Status

GCE_VM = Instance(
    provider=Provider.GCE,
    id="4520031799277582256",
    name="sim-vm-1",
    source="//compute.googleapis.com/projects/sim-project/zones/us-central1-a/instances/sim-vm-1",
    resource_id="projects/sim-project/zones/us-central1-a/instances/sim-vm-1",
    zone="us-central1-a",
    location="us-central1",
    project="sim-project",
)


def instance(name: str, zone: str = "us-central1-a", project: str = "sim-project") -> Instance:
    """Another GCE VM, for per-instance ordering tests (and fleets of them)."""
    resource = f"projects/{project}/zones/{zone}/instances/{name}"
    return Instance(
        provider=Provider.GCE,
        id=str(abs(hash(name)) % 10**18),
        name=name,
        source=f"//compute.googleapis.com/{resource}",
        resource_id=resource,
        zone=zone,
        location=zone.rsplit("-", 1)[0],
        project=project,
    )


def sample_notices(count: int, vm: Instance = GCE_VM) -> list[Notice]:
    """`count` distinct transitions (alternating started/completed live migrations)."""
    base = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
    notices = []
    for i in range(count):
        status = Status.STARTED if i % 2 == 0 else Status.COMPLETED
        observed = base + timedelta(seconds=i)
        notices.append(
            Notice(
                instance=vm,
                kind=Kind.LIVE_MIGRATE,
                status=status,
                notice_id=f"gce-episode-{i // 2}",
                observed_at=observed,
                not_before=observed + timedelta(seconds=60),
                not_before_estimated=True,
                affected=(vm.name,),
                origin=Origin.PLATFORM,
                description="Host maintenance: live migration begins in about 60 s",
                raw={
                    "key": "instance/maintenance-event",
                    "value": "MIGRATE_ON_HOST_MAINTENANCE",
                    "etag": f"{i:016x}",
                },
            )
        )
    return notices


def sample_events(count: int, vm: Instance = GCE_VM) -> list[CloudEvent]:
    return [to_cloudevent(n) for n in sample_notices(count, vm)]


def fleet_events(per_vm: int = 4) -> list[CloudEvent]:
    """Events of three VMs, interleaved as a fleet would produce them."""
    by_vm = [sample_events(per_vm, instance(name)) for name in ("vm-a", "vm-b", "vm-c")]
    return [event for group in zip(*by_vm, strict=True) for event in group]


def per_source(events: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Event ids by source, in order: what per-VM ordering tests compare."""
    order: dict[str, list[str]] = {}
    for event in events:
        order.setdefault(event["source"], []).append(event["id"])
    return order
