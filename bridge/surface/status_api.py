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

Which notice blocks eligibility is `bridge.eligibility`'s rule, which the fleet service
applies to every instance too.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

from bridge import contract
from bridge.eligibility import eligibility
from bridge.surface.listener import Handler, Request, Response

if TYPE_CHECKING:
    from bridge.runner import Observed
    from bridge.surface.health import HealthMonitor

BATCH_CONTENT_TYPE: Final = "application/cloudevents-batch+json"


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
