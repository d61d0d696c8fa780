"""The control API under ``/_sim/``: the Python API over HTTP, JSON in and out.

It lets a client in another process or language (the bridge under test, a shell script, a CI
job) drive the simulator live.  No vendor headers are needed and faults never apply here.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .scenario import ScenarioError, list_scenarios

if TYPE_CHECKING:
    from .server import Simulator

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _ok(payload: Any = None, status: int = 200) -> web.Response:
    return web.json_response({"ok": True} if payload is None else payload, status=status)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw.strip():
        return None
    return json.loads(raw)


def _guard(handler: Handler) -> Handler:
    """Turn bad input into 400/404 JSON errors instead of 500s."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except json.JSONDecodeError as exc:
            return _error(400, f"invalid JSON: {exc}")
        except KeyError as exc:
            return _error(404, f"unknown: {exc}")
        except (ValueError, TypeError, ScenarioError) as exc:
            return _error(400, str(exc))

    return wrapped


def control_routes(sim: Simulator) -> list[web.RouteDef]:
    async def state(request: web.Request) -> web.StreamResponse:
        return _ok(sim.state())

    async def gce_set(request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        if not isinstance(body, dict) or "key" not in body or "value" not in body:
            raise ValueError('body must be {"key": ..., "value": ...}')
        sim.gce.set(str(body["key"]), str(body["value"]))
        return _ok()

    async def gce_delete(request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        if not isinstance(body, dict) or "key" not in body:
            raise ValueError('body must be {"key": ...}')
        sim.gce.delete(str(body["key"]))
        return _ok()

    async def gce_upcoming(request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        if body is not None and not isinstance(body, dict):
            raise ValueError("body must be an object or null")
        sim.gce.set_upcoming_maintenance(body)
        return _ok()

    async def quirks(request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        if not isinstance(body, dict) or set(body) - {"gce", "azure", "aws"}:
            raise ValueError('body must be {"gce": {...}, "azure": {...}, "aws": {...}}')
        sim.gce.quirks.update(body.get("gce", {}))
        sim.azure.quirks.update(body.get("azure", {}))
        sim.aws.quirks.update(body.get("aws", {}))
        return _ok(
            {
                "gce": sim.gce.quirks.as_dict(),
                "azure": sim.azure.quirks.as_dict(),
                "aws": sim.aws.quirks.as_dict(),
            }
        )

    async def azure_add(request: web.Request) -> web.StreamResponse:
        body = await _body(request) or {}
        if not isinstance(body, dict):
            raise ValueError("body must be an object of add_event arguments")
        event_id = sim.azure.add_event(**body)
        return _ok({"EventId": event_id, "DocumentIncarnation": sim.azure.incarnation}, 201)

    async def azure_list(request: web.Request) -> web.StreamResponse:
        return _ok({"DocumentIncarnation": sim.azure.incarnation, "Events": sim.azure.events})

    async def azure_start(request: web.Request) -> web.StreamResponse:
        sim.azure.start_event(request.match_info["event_id"])
        return _ok({"DocumentIncarnation": sim.azure.incarnation})

    async def azure_remove(request: web.Request) -> web.StreamResponse:
        sim.azure.remove_event(request.match_info["event_id"])
        return _ok({"DocumentIncarnation": sim.azure.incarnation})

    async def faults_set(request: web.Request) -> web.StreamResponse:
        body = await _body(request) or {}
        if not isinstance(body, dict):
            raise ValueError("body must be an object")
        provider = body.pop("provider", "all")
        if isinstance(body.get("status_burst"), list):
            body["status_burst"] = tuple(body["status_burst"])
        sim.faults.set(provider, **body)
        return _ok(sim.faults.snapshot())

    async def faults_clear(request: web.Request) -> web.StreamResponse:
        sim.faults.clear(request.query.get("provider", "all"))  # type: ignore[arg-type]
        return _ok(sim.faults.snapshot())

    async def advance(request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        if not isinstance(body, dict) or "seconds" not in body:
            raise ValueError('body must be {"seconds": N}')
        sim.clock.advance(float(body["seconds"]))
        return _ok({"sim_time": sim.clock.now()})

    async def requests_log(request: web.Request) -> web.StreamResponse:
        since = int(request.query.get("since", "0"))
        return _ok([r.as_dict() for r in sim.log.since(since)])

    async def scenario(request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        if body is not None and not isinstance(body, dict):
            raise ValueError('body must be {"name": NAME_OR_PATH} or null')
        sim.load(body.get("name") if body else None)
        return _ok(sim.state())

    async def scenarios(request: web.Request) -> web.StreamResponse:
        return _ok([{"name": n, "description": d} for n, d in list_scenarios()])

    async def redirect_target(request: web.Request) -> web.StreamResponse:
        # reached only by clients that follow the `redirect` fault, which they must not do
        sim.redirects_followed += 1
        return web.Response(text="redirect followed\n")

    async def unknown(request: web.Request) -> web.StreamResponse:
        return _error(404, f"no control endpoint {request.method} {request.path}")

    routes: list[tuple[str, str, Handler]] = [
        ("GET", "/_sim/state", state),
        ("POST", "/_sim/gce/set", gce_set),
        ("POST", "/_sim/gce/delete", gce_delete),
        ("POST", "/_sim/gce/upcoming", gce_upcoming),
        ("POST", "/_sim/quirks", quirks),
        ("GET", "/_sim/azure/events", azure_list),
        ("POST", "/_sim/azure/events", azure_add),
        ("POST", "/_sim/azure/events/{event_id}/start", azure_start),
        ("DELETE", "/_sim/azure/events/{event_id}", azure_remove),
        ("POST", "/_sim/faults", faults_set),
        ("DELETE", "/_sim/faults", faults_clear),
        ("POST", "/_sim/clock/advance", advance),
        ("GET", "/_sim/requests", requests_log),
        ("POST", "/_sim/scenario", scenario),
        ("GET", "/_sim/scenarios", scenarios),
        ("GET", "/_sim/redirect-target", redirect_target),
        ("*", "/_sim/{tail:.*}", unknown),
    ]
    return [web.route(method, path, _guard(handler)) for method, path, handler in routes]
