"""Typed events downstream of the watcher: what the actions, the notices in force and the
status API hold, and the JSON object the sidecar writes for one.

Each maintenance event is decoded once (`bridge.contract.from_cloudevent`) where it enters
the actions and the notices in force; from there on it is a `contract.Event` whose `data` is
a `contract.MaintenanceData`, read by attribute, not by key.

`as_object` gives back the JSON object a consumer saw, attribute for attribute in the order
the sidecar has always written it: `to_cloudevent` writes a maintenance event's attributes
in one order, the audit events were written in another, and both are user-facing (a hook's
stdin, the status API, the audit events' bytes in every sink). `contract.to_dict` has its
own order (the heartbeat's), so it is not used here: the bytes a hook or a sink saw must not
change because the code holding the event became typed.
"""

from __future__ import annotations

import json
from typing import Final

import msgspec

from bridge import contract

#: Attribute order of a maintenance event, as `bridge.pipeline.events.to_cloudevent` writes it.
_MAINTENANCE_ORDER: Final = (
    "specversion",
    "id",
    "source",
    "type",
    "subject",
    "time",
    "datacontenttype",
    "dataschema",
)
#: Attribute order of the audit events (`bridge.actions.audit`): the constants first.
_AUDIT_ORDER: Final = (
    "specversion",
    "datacontenttype",
    "dataschema",
    "id",
    "source",
    "type",
    "subject",
    "time",
)
AUDIT_TYPES: Final = frozenset(
    (
        contract.APPROVED,
        contract.HOOK_COMPLETED,
        contract.BUDGET_RELEASED,
        contract.BUDGET_UNRENEWED,
        contract.TEST,
    )
)


class NotMaintenance(contract.ContractError):
    """An event handed to the actions or the notices in force is not a maintenance event."""


def maintenance(event: contract.Event) -> contract.MaintenanceData:
    """The `data` of a maintenance event (what every action and notice in force is about)."""
    data = event.data
    if not isinstance(data, contract.MaintenanceData):
        raise NotMaintenance(f"{event.type} is not a maintenance event")
    return data


def as_object(event: contract.Event) -> dict[str, object]:
    """The event as the JSON object the sidecar writes (see the module docstring)."""
    attributes = {
        "specversion": event.specversion,
        "id": event.id,
        "source": event.source,
        "type": event.type,
        "subject": event.subject,
        "time": contract.rfc3339(event.time),
        "datacontenttype": event.datacontenttype,
        "dataschema": event.dataschema,
    }
    order = _AUDIT_ORDER if event.type in AUDIT_TYPES else _MAINTENANCE_ORDER
    result: dict[str, object] = {name: attributes[name] for name in order}
    if event.traceparent is not None:  # after the others, as `to_cloudevent` writes it
        result["traceparent"] = event.traceparent
    result["data"] = msgspec.to_builtins(event.data)
    return result


def encode(event: contract.Event) -> bytes:
    """Structured-mode JSON of `event`, byte for byte what the CloudEvents SDK wrote for it
    (`json.dumps` with its default separators and ASCII escapes): what the spool stores."""
    return json.dumps(as_object(event)).encode()
