"""Maintenance events of every provider and shape, for pinning what the actions and the
status API write (tests/test_typed_bytes.py compares it with tests/fixtures/typed/)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final

from bridge.config import Config, parse_config
from bridge.pipeline.model import Instance, Kind, Notice, Origin, Provider, Status, Window
from tests.factories import GCE_VM

AT: Final = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
#: A time with microseconds: the fraction must come out as it did.
FRACTION: Final = AT + timedelta(seconds=90, microseconds=250_000)

AZURE_VM: Final = Instance(
    provider=Provider.AZURE,
    id="9b0c4a5e-1f1d-4f5e-9c1e-6d5f3b2a1c0d",
    name="web_2",
    source="//management.azure.com/subscriptions/sub/resourceGroups/rg/providers/"
    "Microsoft.Compute/virtualMachineScaleSets/web/virtualMachines/2",
    resource_id="/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Compute/"
    "virtualMachineScaleSets/web/virtualMachines/2",
    location="westeurope",
    zone="2",
    subscription="sub",
    resource_group="rg",
    scale_set="web",
)
AWS_VM: Final = Instance(
    provider=Provider.AWS,
    id="i-0123456789abcdef0",
    name="i-0123456789abcdef0",
    source="//ec2.amazonaws.com/accounts/123456789012/regions/eu-west-1/instances/"
    "i-0123456789abcdef0",
    resource_id="arn:aws:ec2:eu-west-1:123456789012:instance/i-0123456789abcdef0",
    zone="eu-west-1a",
    location="eu-west-1",
    account="123456789012",
    instance_type="m7g.large",
)

NOTICES: Final = (
    Notice(
        instance=GCE_VM,
        kind=Kind.LIVE_MIGRATE,
        status=Status.SCHEDULED,
        notice_id="gce-upcoming-1",
        observed_at=AT,
        not_before=FRACTION,
        window=Window(start=FRACTION, end=FRACTION + timedelta(hours=1), latest_start=None),
        affected=(GCE_VM.name,),
        origin=Origin.PLATFORM,
        description="Upcoming maintenance window",
        can_reschedule=True,
        raw={"type": "SCHEDULED", "canReschedule": True, "windowStartTime": "x"},
    ),
    Notice(
        instance=AZURE_VM,
        kind=Kind.FREEZE,
        status=Status.SCHEDULED,
        notice_id="00000000-0000-0000-0000-000000000003",
        observed_at=AT + timedelta(seconds=1),
        revision="r1",
        not_before=AT + timedelta(minutes=15),
        duration_seconds=5,
        affected=("web_2", "Web_1", "web_3"),
        origin=Origin.PLATFORM,
        description="Mise à jour de l'hôte ✓",
        raw={
            "EventId": "00000000-0000-0000-0000-000000000003",
            "EventType": "Freeze",
            "ResourceType": "VirtualMachine",
            "Resources": ["web_2", "Web_1", "web_3"],
            "EventStatus": "Scheduled",
            "NotBefore": "Sat, 21 Nov 2026 12:15:00 GMT",
            "Description": "Mise à jour de l'hôte ✓",
            "EventSource": "Platform",
            "DurationInSeconds": 5,
            "Ratio": 0.5,
        },
    ),
    Notice(
        instance=AZURE_VM,
        kind=Kind.REBOOT,
        status=Status.STARTED,
        notice_id="00000000-0000-0000-0000-000000000009",
        observed_at=AT + timedelta(seconds=2),
        duration_seconds=None,
        affected=("web_2",),
        origin=Origin.USER,
        raw={"EventId": "00000000-0000-0000-0000-000000000009", "EventType": "Reboot"},
    ),
    Notice(
        instance=AWS_VM,
        kind=Kind.TERMINATE,
        status=Status.SCHEDULED,
        notice_id="instance-event-0123",
        observed_at=AT + timedelta(seconds=3),
        not_before=AT + timedelta(days=3),
        not_before_estimated=False,
        window=Window(start=AT + timedelta(days=3), end=None),
        affected=(AWS_VM.id,),
        origin=Origin.PLATFORM,
        description="The instance is running on degraded hardware",
        raw={"Code": "instance-stop", "State": "active", "NotBefore": "21 Nov 2026"},
    ),
    Notice(
        instance=GCE_VM,
        kind=Kind.PREEMPT,
        status=Status.STARTED,
        notice_id="gce-preempt-1",
        observed_at=AT + timedelta(seconds=4),
        affected=(GCE_VM.name,),
        raw=None,
    ),
    Notice(
        instance=AWS_VM,
        kind=Kind.TERMINATE,
        status=Status.COMPLETED,
        notice_id="instance-event-0123",
        observed_at=AT + timedelta(days=3, seconds=5),
        affected=(AWS_VM.id,),
        raw={"Code": "instance-stop", "State": "completed"},
    ),
)


def actions_config() -> Config:
    """Hooks, the vendor-sample preset and `self` leadership (plans for every sample)."""
    return parse_config(
        {
            "hooks": [
                {"name": "drain", "command": ["drain.sh"], "deadline_before": 30.0},
                {"command": ["/usr/local/bin/checkpoint", "--fast"], "statuses": ["scheduled"]},
                {"name": "freeze-only", "command": ["f"], "kinds": ["freeze"]},
            ],
            "approval": {"preset": "vendor-sample", "leader": "self"},
        }
    )
