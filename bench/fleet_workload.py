"""The workload of issue 33: a fleet of 100,000 VMs as CloudEvents of the event contract.

`Workload(instances, events)` describes it; its methods write the events, each with the
sidecar's own writers (`heartbeat_event` + `contract.encode`, `to_cloudevent` +
`serialize`), so that every body is exactly what a sidecar of this build would send:

- the VMs: a third on each cloud (GCE over three regions of three zones, Azure over three
  locations of three zones, AWS over three regions of three availability zones); the first
  region of each cloud holds half of that cloud's VMs, so that one region's maintenance
  touches a crowd (the burst);
- `history()`: the audit log, `events` in all. Per VM, one heartbeat every 300 s going back
  from now (the steady state of 333 heartbeats a second at 100,000 VMs), one VM in four
  with a finished notice (scheduled, started, completed) in the past day, and 5,000
  notices in force (scheduled, a start within the next two days; one in five started);
- `heartbeats(count)`: fresh heartbeats (new ids, later sequence numbers) VM after VM in
  the fleet's order; `due_heartbeats(count)`: the same in the order they fall due, as a
  real fleet sends them (what the ingest figures of `bench.fleet_scale` post);
- `burst(count)`: a region's maintenance starts: a new notice scheduled, then started, for
  each VM of the busiest region, in that order, until `count` events.

Writing is the sidecar's code per event (about 20 us here), so 1,000,000 events take
tens of seconds; `history()` is a generator, so that a fill never holds them all.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Final

from bridge import contract
from bridge.pipeline.events import serialize, to_cloudevent
from bridge.pipeline.heartbeat import heartbeat_event
from bridge.pipeline.model import Instance, Kind, Notice, Provider, Status
from bridge.providers.aws.watcher import instance_of as aws_instance_of

INTERVAL: Final = 300.0
IN_FORCE: Final = 5_000
BURST: Final = 50_000
#: Regions (and their zones) of each cloud; the first of each holds half its VMs.
GCE_REGIONS: Final = ("us-central1", "europe-west1", "asia-east1")
AZURE_LOCATIONS: Final = ("westeurope", "eastus", "southeastasia")
AWS_REGIONS: Final = ("us-east-1", "eu-west-1", "ap-southeast-1")
SUBSCRIPTION: Final = "8c56d827-5f07-45ce-8f2b-6c5001db5c6f"
ACCOUNT: Final = "123456789012"
KINDS: Final = {
    Provider.GCE: Kind.LIVE_MIGRATE,
    Provider.AZURE: Kind.FREEZE,
    Provider.AWS: Kind.REBOOT,
}


def _region(index: int) -> int:
    """Region 0 for half the VMs of a cloud, 1 and 2 for a quarter each."""
    slot = (index // 3) % 4
    return 0 if slot < 2 else slot - 1


def vm(index: int) -> Instance:
    """VM `index` of the fleet (stable: the same index is the same VM in every run)."""
    region = _region(index)
    zone = (index // 12) % 3
    match index % 3:
        case 0:
            name = f"gce-{index:06d}"
            place = GCE_REGIONS[region]
            return Instance(
                provider=Provider.GCE,
                id=str(4_000_000_000 + index),
                name=name,
                source=f"//compute.googleapis.com/projects/fleet-project/zones/{place}-"
                f"{'abc'[zone]}/instances/{name}",
                resource_id=str(4_000_000_000 + index),
                zone=f"{place}-{'abc'[zone]}",
                location=place,
                project="fleet-project",
            )
        case 1:
            name = f"az-{index:06d}"
            place = AZURE_LOCATIONS[region]
            group = f"fleet-{place}"
            resource = (
                f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{group}/providers/"
                f"Microsoft.Compute/virtualMachines/{name}"
            )
            return Instance(
                provider=Provider.AZURE,
                id=f"vm-{name}",
                name=name,
                source=resource,
                resource_id=resource,
                zone=str(zone + 1),
                location=place,
                subscription=SUBSCRIPTION,
                resource_group=group,
                scale_set=f"set-{index % 40}",
            )
        case _:
            place = AWS_REGIONS[region]
            return aws_instance_of(
                {
                    "instanceId": f"i-{index:017x}",
                    "region": place,
                    "accountId": ACCOUNT,
                    "availabilityZone": f"{place}{'abc'[zone]}",
                    "instanceType": "m6i.large",
                }
            )


def heartbeat(
    instance: Instance, sequence: int, at: datetime, up_for: timedelta = timedelta(days=30)
) -> bytes:
    """A heartbeat as the sidecar writes it, from a sidecar started `up_for` before `at`."""
    event = heartbeat_event(
        instance,
        sequence=sequence,
        started_at=at - up_for,
        interval=INTERVAL,
        watcher_healthy=True,
        spool_depth=0,
        at=at,
    )
    return contract.encode(event)


def transition(
    instance: Instance, notice_id: str, status: Status, at: datetime, not_before: datetime
) -> bytes:
    notice = Notice(
        instance,
        KINDS[instance.provider],
        status,
        f"{instance.name}-{notice_id}",
        at,
        not_before=not_before,
        affected=(instance.name,),
    )
    return serialize(to_cloudevent(notice))


@dataclass(frozen=True)
class Workload:
    """The fleet of `instances` VMs and its audit log of `events` events (see the module)."""

    instances: int
    events: int
    now: datetime = field(default_factory=lambda: datetime.now(UTC).replace(microsecond=0))

    @cached_property
    def vms(self) -> list[Instance]:
        return [vm(index) for index in range(self.instances)]

    @property
    def in_force(self) -> int:
        """Notices in force: 5,000 at 100,000 VMs, one VM in 20 at smaller sizes."""
        return min(IN_FORCE, max(1, self.instances // 20))

    def in_force_vm(self, number: int) -> Instance:
        """The VM of notice in force `number` (spread evenly over the fleet)."""
        return self.vms[number * (self.instances // self.in_force)]

    def quiet_vm(self) -> Instance:
        """A VM with no notice in force."""
        return self.vms[1]

    def history(self) -> Iterator[bytes]:
        """The audit log: `events` events, oldest first within each part."""
        now, rng = self.now, random.Random(33)
        written = 0
        for number in range(self.in_force):
            instance = self.in_force_vm(number)
            not_before = now + timedelta(minutes=rng.randrange(5, 48 * 60))
            yield transition(
                instance, "due", Status.SCHEDULED, now - timedelta(hours=1), not_before
            )
            written += 1
            if number % 5 == 0:
                yield transition(
                    instance, "due", Status.STARTED, now - timedelta(minutes=5), not_before
                )
                written += 1
        for index in range(0, self.instances, 4):
            if written + 3 > self.events:
                break
            instance = self.vms[index]
            start = now - timedelta(hours=rng.randrange(2, 24))
            for step, status in enumerate((Status.SCHEDULED, Status.STARTED, Status.COMPLETED)):
                at = start + timedelta(minutes=20 * step)
                yield transition(instance, "done", status, at, start + timedelta(minutes=20))
            written += 3
        rounds = -(-(self.events - written) // self.instances) if self.events > written else 0
        for round_ in range(rounds):  # round 0 is the latest, `rounds - 1` the oldest
            for index, instance in enumerate(self.vms):
                if written >= self.events:
                    return
                at = now - timedelta(seconds=INTERVAL * round_ + index % int(INTERVAL))
                yield heartbeat(instance, rounds - round_, at)
                written += 1

    def heartbeats(self, count: int, first_sequence: int = 1_000_000) -> list[bytes]:
        """`count` new heartbeats round the fleet, after every one of `history()`."""
        at = datetime.now(UTC)
        return [
            heartbeat(self.vms[n % self.instances], first_sequence + n // self.instances, at)
            for n in range(count)
        ]

    def due_heartbeats(self, count: int, first_sequence: int = 1_000_000) -> list[bytes]:
        """`count` new heartbeats in the order they fall due after `history()`, whose latest
        round gave VM `i` a heartbeat `i % INTERVAL` seconds before its start: the VMs of the
        oldest second first, then the next second's, round after round. A real fleet's
        heartbeats come so, from VMs all over the fleet at once; in the fleet's order
        (`heartbeats`) a batch's VMs are neighbours in every index keyed by name or source,
        which costs the store 1.3 to 1.6 times less than what a fleet sends (bench.fleet_writes)."""
        every = int(INTERVAL)
        order = sorted(range(self.instances), key=lambda i: (-(i % every), i))
        at = datetime.now(UTC)
        return [
            heartbeat(self.vms[order[n % self.instances]], first_sequence + n // self.instances, at)
            for n in range(count)
        ]

    def busiest_region(self) -> list[Instance]:
        """The VMs of GCE's first region (the largest one of the fleet)."""
        return [v for v in self.vms if v.location == GCE_REGIONS[0]]

    def burst(self, count: int = BURST, tag: str = "burst") -> list[bytes]:
        """A region's maintenance starts: per VM of the busiest region a notice scheduled,
        then started (rounds of new notices when the region has fewer VMs than that)."""
        region = self.busiest_region()
        now = datetime.now(UTC)
        bodies: list[bytes] = []
        round_ = 0
        while len(bodies) < count:
            for status in (Status.SCHEDULED, Status.STARTED):
                for instance in region:
                    if len(bodies) >= count:
                        return bodies
                    bodies.append(transition(instance, f"{tag}-{round_}", status, now, now))
            round_ += 1
        return bodies
