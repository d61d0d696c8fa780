"""The cloud-neutral record of one maintenance notice in one state.

Watchers translate what a metadata service says into `Notice` values; everything after them
(normalization into CloudEvents, hooks, approval, status API) reads only this module's types,
so a third cloud would need a watcher and nothing else. Times are timezone-aware UTC and are
the source's own whenever the source gives one: a notice never pretends that "now" is the
provider's timestamp.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class Provider(StrEnum):
    GCE = "gce"
    AZURE = "azure"
    AWS = "aws"


class Kind(StrEnum):
    """What the maintenance does to the VM (schema v1 enumerates exactly these)."""

    LIVE_MIGRATE = "live-migrate"
    TERMINATE = "terminate"
    FREEZE = "freeze"
    REBOOT = "reboot"
    REDEPLOY = "redeploy"
    PREEMPT = "preempt"
    DELETE = "delete"
    UNKNOWN = "unknown"


class Status(StrEnum):
    """Where the notice is in its life; also the last word of the CloudEvent type."""

    SCHEDULED = "scheduled"
    STARTED = "started"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


class Origin(StrEnum):
    PLATFORM = "platform"
    USER = "user"


@dataclass(frozen=True, slots=True)
class Instance:
    """Identity of the VM the bridge runs on, as its metadata service reports it.

    `source` is the CloudEvents source: globally unique per VM, so `source` + `id` is the
    consumers' de-duplication key.
    """

    provider: Provider
    id: str
    name: str
    source: str
    resource_id: str
    zone: str | None = None
    location: str | None = None
    project: str | None = None
    subscription: str | None = None
    resource_group: str | None = None
    scale_set: str | None = None
    #: AWS account id and instance type; optional in the contract, so only written when set
    #: (the events of the other providers stay byte for byte what they were).
    account: str | None = None
    instance_type: str | None = None

    def as_data(self) -> dict[str, str | None]:
        """The `data.instance` object of the event contract."""
        optional = {"account": self.account, "instance_type": self.instance_type}
        return {
            "id": self.id,
            "name": self.name,
            "zone": self.zone,
            "location": self.location,
            "project": self.project,
            "subscription": self.subscription,
            "resource_group": self.resource_group,
            "scale_set": self.scale_set,
            "resource_id": self.resource_id,
        } | {key: value for key, value in optional.items() if value is not None}


@dataclass(frozen=True, slots=True)
class Window:
    """A maintenance window announced in advance (GCE upcoming-maintenance)."""

    start: datetime | None
    end: datetime | None
    latest_start: datetime | None = None


@dataclass(frozen=True, slots=True)
class Notice:
    """One maintenance notice in one state, as observed at `observed_at`.

    `notice_id` names the maintenance (Azure `EventId`; for GCE an id of the episode the
    watcher derived from the key and the transition). `revision` distinguishes two
    announcements of the same notice in the same status (an Azure event whose fields
    changed while Scheduled); together with the source and status it makes the event id.
    """

    instance: Instance
    kind: Kind
    status: Status
    notice_id: str
    observed_at: datetime
    revision: str = ""
    not_before: datetime | None = None
    not_before_estimated: bool = False
    window: Window | None = None
    duration_seconds: int | None = None
    affected: tuple[str, ...] = ()
    origin: Origin | None = None
    description: str | None = None
    can_reschedule: bool | None = None
    raw: Any = field(default=None, compare=False)
    #: The notice ended without the bridge seeing it start: the watcher concluded from the
    #: vendor's own rules that it ran (Azure: it vanished while Scheduled after its NotBefore,
    #: or after this VM approved it). Written to the event only when true.
    outcome_inferred: bool = False

    @property
    def provider(self) -> Provider:
        return self.instance.provider
