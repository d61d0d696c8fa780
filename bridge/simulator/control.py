"""The control API under ``/_sim/``: the Python API over HTTP, JSON in and out.

It lets a client in another process or language (the bridge under test, a shell script, a CI
job) drive the simulator live.  No vendor headers are needed and faults never apply here.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from .scenario import ScenarioError, list_scenarios

if TYPE_CHECKING:
    from .attestation import Signer
    from .clock import SimClock
    from .faults import Faults
    from .requestlog import RequestLog

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ControlledSimulator(Protocol):
    """What the control API drives of the simulator (`Simulator`, which builds these routes
    and so is not imported here; see `running` for how mypy checks it)."""

    states: dict[str, Any]
    redirects_followed: int

    @property
    def faults(self) -> Faults: ...
    @property
    def clock(self) -> SimClock: ...
    @property
    def log(self) -> RequestLog: ...
    @property
    def signer(self) -> Signer: ...
    def state(self) -> dict[str, Any]: ...
    def load(self, scenario: str | None) -> None: ...


def ok(payload: Any = None, status: int = 200) -> web.Response:
    return web.json_response({"ok": True} if payload is None else payload, status=status)


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def read_body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw.strip():
        return None
    return json.loads(raw)


def guard(handler: Handler) -> Handler:
    """Turn bad input into 400/404 JSON errors instead of 500s."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except json.JSONDecodeError as exc:
            return error(400, f"invalid JSON: {exc}")
        except KeyError as exc:
            return error(404, f"unknown: {exc}")
        except (ValueError, TypeError, ScenarioError) as exc:
            return error(400, str(exc))

    return wrapped


def routes_of(routes: list[tuple[str, str, Handler]]) -> list[web.RouteDef]:
    """(method, path, handler) as aiohttp routes, each behind `guard`."""
    return [web.route(method, path, guard(handler)) for method, path, handler in routes]


def control_routes(sim: ControlledSimulator) -> list[web.RouteDef]:
    """The control API's common part; each provider adds its own (`control_routes`) before
    it, as the catch-all for unknown `/_sim/` paths comes last."""

    async def state(request: web.Request) -> web.StreamResponse:
        return ok(sim.state())

    async def quirks(request: web.Request) -> web.StreamResponse:
        body = await read_body(request)
        if not isinstance(body, dict) or set(body) - set(sim.states):
            shape = ", ".join(f'"{name}": {{...}}' for name in sim.states)
            raise ValueError(f"body must be {{{shape}}}")
        for name, simulated in sim.states.items():
            simulated.quirks.update(body.get(name, {}))
        return ok({name: simulated.quirks.as_dict() for name, simulated in sim.states.items()})

    async def faults_set(request: web.Request) -> web.StreamResponse:
        body = await read_body(request) or {}
        if not isinstance(body, dict):
            raise ValueError("body must be an object")
        provider = body.pop("provider", "all")
        if isinstance(body.get("status_burst"), list):
            body["status_burst"] = tuple(body["status_burst"])
        sim.faults.set(provider, **body)
        return ok(sim.faults.snapshot())

    async def faults_clear(request: web.Request) -> web.StreamResponse:
        sim.faults.clear(request.query.get("provider", "all"))
        return ok(sim.faults.snapshot())

    async def advance(request: web.Request) -> web.StreamResponse:
        body = await read_body(request)
        if not isinstance(body, dict) or "seconds" not in body:
            raise ValueError('body must be {"seconds": N}')
        sim.clock.advance(float(body["seconds"]))
        return ok({"sim_time": sim.clock.now()})

    async def requests_log(request: web.Request) -> web.StreamResponse:
        since = int(request.query.get("since", "0"))
        return ok([r.as_dict() for r in sim.log.since(since)])

    async def scenario(request: web.Request) -> web.StreamResponse:
        body = await read_body(request)
        if body is not None and not isinstance(body, dict):
            raise ValueError('body must be {"name": NAME_OR_PATH} or null')
        sim.load(body.get("name") if body else None)
        return ok(sim.state())

    async def scenarios(request: web.Request) -> web.StreamResponse:
        return ok([{"name": n, "description": d} for n, d in list_scenarios()])

    async def redirect_target(request: web.Request) -> web.StreamResponse:
        # reached only by clients that follow the `redirect` fault, which they must not do
        sim.redirects_followed += 1
        return web.Response(text="redirect followed\n")

    async def identity_trust(request: web.Request) -> web.StreamResponse:
        # what a fleet verifying this simulator's identity documents is configured with
        return ok(sim.signer.trust())

    async def unknown(request: web.Request) -> web.StreamResponse:
        return error(404, f"no control endpoint {request.method} {request.path}")

    routes: list[tuple[str, str, Handler]] = [
        ("GET", "/_sim/state", state),
        ("POST", "/_sim/quirks", quirks),
        ("POST", "/_sim/faults", faults_set),
        ("DELETE", "/_sim/faults", faults_clear),
        ("POST", "/_sim/clock/advance", advance),
        ("GET", "/_sim/requests", requests_log),
        ("POST", "/_sim/scenario", scenario),
        ("GET", "/_sim/scenarios", scenarios),
        ("GET", "/_sim/redirect-target", redirect_target),
        ("GET", "/_sim/identity/trust", identity_trust),
        ("*", "/_sim/{tail:.*}", unknown),
    ]
    return routes_of(routes)
