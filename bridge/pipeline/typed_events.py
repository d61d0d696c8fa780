"""Typed events downstream of the watcher: what the actions, the notices in force and the
status API hold.

Each maintenance event is decoded once (`bridge.contract.from_cloudevent`) where it enters
the actions and the notices in force; from there on it is a `contract.Event` whose `data` is
a `contract.MaintenanceData`, read by attribute, not by key. Its bytes, wherever they go (a
hook's stdin, the status API, the spool), are `contract.encode`'s.
"""

from __future__ import annotations

from bridge import contract


class NotMaintenance(contract.ContractError):
    """An event handed to the actions or the notices in force is not a maintenance event."""


def maintenance(event: contract.Event) -> contract.MaintenanceData:
    """The `data` of a maintenance event (what every action and notice in force is about)."""
    data = event.data
    if not isinstance(data, contract.MaintenanceData):
        raise NotMaintenance(f"{event.type} is not a maintenance event")
    return data
