"""The paths the listener serves: metrics, liveness, readiness and the status API.

`/healthz` and `/readyz` answer 200 or 503 with a JSON body listing every check, so the same
answer serves a kubelet probe (status code) and a human with curl (the reasons).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from bridge.config import Listener as ListenerSettings
from bridge.surface import metrics, status_api
from bridge.surface.health import Check, HealthMonitor, all_ok
from bridge.surface.listener import Handler, Listener, Request, Response

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def _report(checks: list[Check]) -> Response:
    ok = all_ok(checks)
    return Response.json(
        200 if ok else 503,
        {"status": "ok" if ok else "failing", "checks": [c.as_dict() for c in checks]},
    )


def build_routes(monitor: HealthMonitor) -> dict[str, Handler]:
    async def healthz(_request: Request) -> Response:
        return _report(monitor.liveness())

    async def readyz(_request: Request) -> Response:
        return _report(monitor.readiness())

    async def metrics_text(_request: Request) -> Response:
        return Response(200, (await metrics.render(monitor)).encode(), PROMETHEUS_TEXT)

    return {
        "/healthz": healthz,
        "/readyz": readyz,
        "/metrics": metrics_text,
        **status_api.build_routes(monitor),
    }


@asynccontextmanager
async def serving(
    settings: ListenerSettings, monitor: HealthMonitor
) -> AsyncIterator[Listener | None]:
    """Serve the routes for the block's duration (nothing when the listener is disabled)."""
    if not settings.enabled:
        yield None
        return
    listener = Listener(settings.host, settings.port, build_routes(monitor))
    await listener.start()
    try:
        yield listener
    finally:
        await listener.stop()
