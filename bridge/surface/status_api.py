"""The local status API: what maintenance is in force on this VM, and may it lead or serve?

Served by the bridge's own listener (loopback by default), for programs on the VM and for a
load balancer's health check:

- `GET /v1/notices`: the notices in force as a JSON array of CloudEvents
  (`application/cloudevents-batch+json`), the same events the sinks got.
- `GET /v1/eligible`: 200 when no maintenance is started or scheduled within
  `status.eligible_horizon` seconds (or `?horizon=SECONDS`), else 503; both with a JSON body
  saying why. While the bridge is still starting it answers 503 (it cannot vouch yet). A
  leader-election loop asks it before taking or renewing leadership, a load balancer's
  health probe uses it to drain the VM before the impact.

A notice blocks eligibility when it has started (a GCE preemption counts as started: the VM
is going away), when it is scheduled within the horizon, or when it is scheduled with no
known time (we cannot promise it is far away). A notice scheduled beyond the horizon does
not block; it is listed under `upcoming` so the caller can see it coming.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

from bridge import contract
from bridge.pipeline.typed_events import maintenance
from bridge.surface.listener import Handler, Request, Response

if TYPE_CHECKING:
    from bridge.runner import Observed
    from bridge.surface.health import HealthMonitor

BATCH_CONTENT_TYPE: Final = "application/cloudevents-batch+json"


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
    """Whether this VM is eligible, and the body that says why (see the module docstring)."""
    blocking: list[dict[str, object]] = []
    upcoming: list[dict[str, object]] = []
    first = ""
    for event in events:
        data = maintenance(event)
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


def notices_body(events: Iterable[contract.Event]) -> bytes:
    """`/v1/notices`: the events as the JSON array the sinks' consumers would see (each
    event's bytes `contract.encode`'s, as in a webhook batch)."""
    return b"[" + b",".join(contract.encode(event) for event in events) + b"]\n"


def _current(observed: Observed) -> list[contract.Event]:
    """The notices in force, oldest announcement first."""
    return sorted(observed.in_force.events(), key=lambda event: event.time)


def _not_watching(monitor: HealthMonitor) -> Response:
    return Response.json(
        503,
        {
            "eligible": False,
            "reason": f"{monitor.phase}: not watching yet, nothing can be vouched for",
        },
    )


def build_routes(monitor: HealthMonitor) -> dict[str, Handler]:
    """`GET /v1/notices`, `GET /v1/eligible` (`?horizon=SECONDS` overrides the configured one)."""

    async def notices(_request: Request) -> Response:
        if monitor.observed is None:
            return _not_watching(monitor)
        return Response(200, notices_body(_current(monitor.observed)), BATCH_CONTENT_TYPE)

    async def eligible(request: Request) -> Response:
        observed = monitor.observed
        if observed is None:
            return _not_watching(monitor)
        horizon = observed.eligible_horizon
        if "horizon" in request.query:
            try:
                horizon = float(request.query["horizon"])
                if not 0 <= horizon < float("inf"):
                    raise ValueError
            except ValueError:
                return Response.json(400, {"error": "horizon must be a number of seconds >= 0"})
        ok, body = eligibility(_current(observed), datetime.now(UTC), horizon)
        return Response.json(200 if ok else 503, body)

    return {"/v1/notices": notices, "/v1/eligible": eligible}
