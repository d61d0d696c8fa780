"""Eligibility: may this VM lead or serve now, given the maintenance notices in force?

One rule, two askers: the sidecar's status API (`GET /v1/eligible`, `bridge.surface.status_api`)
applies it to its own VM's notices, the fleet service (`bridge.fleet.state.eligible`) to each
instance's notices in its store. Beside the contract, which is all it reads.

A notice blocks eligibility when it has started (a GCE preemption counts as started: the VM
is going away), when it is scheduled within the horizon, or when it is scheduled with no
known time (we cannot promise it is far away). A notice scheduled beyond the horizon does
not block; it is listed under `upcoming` so the caller can see it coming.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from bridge import contract


def _summary(
    event: contract.Event, data: contract.MaintenanceData, now: datetime
) -> tuple[dict[str, object], float | None]:
    """What the body says of one notice, and the seconds until it starts (None: unknown)."""
    start = data.not_before or (data.window.start if data.window is not None else None)
    until = None if start is None else round((start - now).total_seconds(), 1)
    summary: dict[str, object] = {
        "notice_id": data.notice_id,
        "event_id": event.id,
        "provider": data.provider,
        "kind": data.kind,
        "status": data.status,
        "not_before": None if data.not_before is None else contract.rfc3339(data.not_before),
        "seconds_until": until,
    }
    return summary, until


def eligibility(
    events: Iterable[contract.Event], now: datetime, horizon: float
) -> tuple[bool, dict[str, object]]:
    """Whether the VM of `events` (its notices in force) is eligible at `now`, and the body
    that says why (see the module docstring)."""
    blocking: list[dict[str, object]] = []
    upcoming: list[dict[str, object]] = []
    first = ""
    for event in events:
        data = event.data
        if not isinstance(data, contract.MaintenanceData):
            raise contract.ContractError(f"{event.type} is not a maintenance event")
        summary, until = _summary(event, data, now)
        if data.status == "started":
            summary["reason"] = reason = "started"
        elif until is None:
            summary["reason"] = reason = "scheduled, time unknown"
        elif until <= horizon:
            summary["reason"] = reason = f"scheduled within the horizon ({horizon:g} s)"
        else:
            upcoming.append(summary)
            continue
        if not blocking:
            first = f"{data.provider} {data.kind} {reason} ({data.notice_id})"
        blocking.append(summary)
    if blocking:
        reason = first
    elif upcoming:
        reason = "maintenance scheduled, but beyond the horizon"
    else:
        reason = "no maintenance in force"
    body: dict[str, object] = {
        "eligible": not blocking,
        "reason": reason,
        "horizon_seconds": horizon,
        "blocking": blocking,
        "upcoming": upcoming,
    }
    return not blocking, body
