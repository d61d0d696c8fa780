"""Normalization: a `Notice` becomes a CloudEvent of the public contract, schema version 1.

`to_event` is pure: the same notice always gives the same event, byte for byte
(`bridge.contract.encode`), on any machine. The event id is a UUIDv5 of the source, the
notice id, the status and the revision, so a transition announced again after a restart or
by a second replica keeps its id and consumers can de-duplicate on `source` + `id`, while
two different transitions never share one. Everything downstream (spool, sinks) handles
the structured-JSON bytes `contract.encode` writes for it, and reads them back with `parse`
or `contract.from_cloudevent`.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from functools import cache
from typing import Any, Final

from cloudevents.core.v1.event import CloudEvent

from bridge import contract

# The contract's constants, re-exported: the one definition lives in bridge/contract.py.
from bridge.contract import CONTENT_TYPE as CONTENT_TYPE
from bridge.contract import MAINTENANCE_TYPES
from bridge.contract import SCHEMA_URI as SCHEMA_URI
from bridge.contract import SCHEMA_VERSION as SCHEMA_VERSION
from bridge.contract import TYPE_PREFIX as TYPE_PREFIX

# The wire format, re-exported: its one definition is bridge/infra/encoding.py.
from bridge.infra.encoding import as_dict as as_dict
from bridge.infra.encoding import parse as parse
from bridge.infra.encoding import serialize as serialize
from bridge.pipeline.model import Instance, Notice, Window

SCHEMA_FILE: Final = f"maintenance-event.v{SCHEMA_VERSION}.json"
EVENT_TYPES: Final = MAINTENANCE_TYPES

# Fixed forever: changing it would change every event id ever emitted.
_ID_NAMESPACE: Final = uuid.UUID("6f1c3a52-90b1-4c57-9d1e-6a0c1b7e2d45")
# Fixed forever too: the trace ids of events already delivered must not change.
_TRACE_NAMESPACE: Final = uuid.UUID("0b5a7f0e-3c1d-5e8a-9f42-7d6c2e1b4a93")


def event_id(notice: Notice) -> str:
    """The deterministic id of the transition `notice` records."""
    key = "\n".join(
        (notice.instance.source, notice.notice_id, notice.status.value, notice.revision)
    )
    return str(uuid.uuid5(_ID_NAMESPACE, key))


def trace_context(trace: str, event_id: str) -> str:
    """A CloudEvents distributed-tracing extension (W3C Trace Context `traceparent`): the
    trace id is a UUIDv5 of `trace` (what the events of one trace share), the parent id is
    derived from `event_id` (one span per event). Deterministic like the ids, so an event
    written again carries the same one."""
    trace_id = uuid.uuid5(_TRACE_NAMESPACE, trace).hex
    span = uuid.uuid5(_TRACE_NAMESPACE, event_id).hex[:16]
    return f"00-{trace_id}-{span}-01"  # version 00, sampled


def maintenance_trace(source: str, notice_id: str) -> str:
    """The trace of one maintenance of one VM: every transition of the notice and every
    audit event about it (hook runs, approvals, budget slots) share its trace id, so one
    maintenance can be followed from the metadata service to the fleet's audit log."""
    return f"{source}\n{notice_id}"


def traceparent(notice: Notice) -> str:
    """The `traceparent` of the event announcing `notice`: the maintenance's trace, the
    transition's span."""
    return trace_context(
        maintenance_trace(notice.instance.source, notice.notice_id), event_id(notice)
    )


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)


def instance_data(instance: Instance) -> contract.InstanceData:
    """The contract's `data.instance` of the VM (`account`, `instance_type` only when set)."""
    return contract.InstanceData(
        id=instance.id,
        name=instance.name,
        zone=instance.zone,
        location=instance.location,
        project=instance.project,
        subscription=instance.subscription,
        resource_group=instance.resource_group,
        scale_set=instance.scale_set,
        resource_id=instance.resource_id,
        account=instance.account,
        instance_type=instance.instance_type,
    )


def _window(window: Window | None) -> contract.WindowData | None:
    if window is None:
        return None
    return contract.WindowData(
        start=_utc(window.start), end=_utc(window.end), latest_start=_utc(window.latest_start)
    )


def maintenance_data(notice: Notice) -> contract.MaintenanceData:
    """The `data` of schema version 1 (`outcome_inferred` is written only when true)."""
    return contract.MaintenanceData(
        provider=notice.provider.value,
        instance=instance_data(notice.instance),
        kind=notice.kind.value,
        status=notice.status.value,
        notice_id=notice.notice_id,
        not_before=_utc(notice.not_before),
        not_before_estimated=notice.not_before_estimated,
        window=_window(notice.window),
        duration_seconds=notice.duration_seconds,
        affected=list(notice.affected),
        origin=notice.origin.value if notice.origin else None,
        description=notice.description,
        can_reschedule=notice.can_reschedule,
        raw=notice.raw,
        outcome_inferred=notice.outcome_inferred,
    )


def to_event(notice: Notice) -> contract.Event:
    """The event that announces `notice` (pure; see the module docstring): what the spool
    stores, as `contract.encode` writes it."""
    ident = event_id(notice)  # once: the traceparent's span derives from it too
    source = notice.instance.source
    return contract.Event(
        id=ident,
        source=source,
        type=TYPE_PREFIX + notice.status.value,
        subject=notice.instance.name,
        time=notice.observed_at.astimezone(UTC),
        traceparent=trace_context(maintenance_trace(source, notice.notice_id), ident),
        data=maintenance_data(notice),
    )


def to_cloudevent(notice: Notice) -> CloudEvent:
    """`to_event` as the CloudEvents SDK's object, for code that hands events to a sink's
    `publish` directly (the same bytes: `serialize` keeps the attribute order)."""
    return parse(contract.encode(to_event(notice)))


@cache
def schema_text() -> str:
    """The JSON Schema of version 1, as shipped in the package."""
    # Imported here: importlib.resources pulls in tempfile, shutil and the compression
    # modules, 0.8 MiB of a running bridge's footprint for a file it rarely reads.
    from importlib import resources

    return (resources.files("bridge") / "schemas" / SCHEMA_FILE).read_text(encoding="utf-8")


def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(schema_text())
    return loaded
