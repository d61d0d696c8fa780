"""Middleware in front of the vendor endpoints: request log, faults, vendor headers.

Faults are applied here, outside the providers' handlers, so every fault works the same way on
every endpoint, and so a vendor's response headers (GCE's ``Metadata-Flavor: Google``) are
added to *every* response (errors, 404s, fault answers) in one place, by the provider's part
(`SimulatedProvider.finish`) - except when the ``missing_vendor_header`` fault deliberately
leaves them out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from aiohttp import web
from aiohttp.typedefs import Middleware

from .faults import FaultSet
from .requestlog import RequestRecord

if TYPE_CHECKING:
    from .clock import SimClock
    from .faults import Faults
    from .part import SimulatedProvider
    from .requestlog import RequestLog

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
REDIRECT_TARGET = "/_sim/redirect-target"


class FrontedSimulator(Protocol):
    """What the middleware reads of the simulator it fronts (`Simulator`, which installs it
    and so is not imported here; see `running` for how mypy checks it)."""

    @property
    def parts(self) -> Sequence[SimulatedProvider]: ...
    @property
    def faults(self) -> Faults: ...
    @property
    def log(self) -> RequestLog: ...
    @property
    def clock(self) -> SimClock: ...
    @property
    def stopping(self) -> asyncio.Event: ...
    @property
    def base_url(self) -> str: ...
    def serves(self, provider: str) -> bool: ...


def provider_of(sim: FrontedSimulator, path: str) -> SimulatedProvider | None:
    """Which served provider answers ``path``: the one claiming its prefix (Azure
    ``/metadata``, AWS ``/latest/``), else the one answering everything else (GCE)."""
    for simulated in sim.parts:
        claims = simulated.path_prefix and path.startswith(simulated.path_prefix)
        if claims and sim.serves(simulated.name):
            return simulated
    for simulated in sim.parts:
        if not simulated.path_prefix and sim.serves(simulated.name):
            return simulated
    return None


def _corrupt(response: web.Response) -> None:
    """Truncate JSON (invalid document) or replace a plain value with garbage."""
    body = response.body if isinstance(response.body, bytes) else b""
    if "json" in response.headers.get("Content-Type", ""):
        response.body = body[: max(1, len(body) // 2)] if len(body) > 1 else b"{"
    else:
        response.body = b"\xff\xfe<garbage\x00"


def _drop(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()
    # nothing must be written after the abort; cancelling is silent in aiohttp
    raise asyncio.CancelledError


async def _hang(sim: FrontedSimulator, faults: FaultSet, request: web.Request) -> None:
    while faults.hang and not sim.stopping.is_set():
        stop = asyncio.ensure_future(sim.stopping.wait())
        unhang = asyncio.ensure_future(sim.faults.unhang.wait())
        try:
            await asyncio.wait({stop, unhang}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            unhang.cancel()
    if sim.stopping.is_set():
        _drop(request)


def vendor_middleware(sim: FrontedSimulator) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/_sim/"):
            return await handler(request)
        provider = provider_of(sim, request.path)
        if provider is None:
            return web.Response(status=404, text="not served by this simulator\n")
        record = sim.log.add(
            sim_time=sim.clock.now(),
            provider=provider.name,
            method=request.method,
            path=request.path,
            query=dict(request.query),
            headers=dict(request.headers),
            client=request.remote or "",
        )
        loop = asyncio.get_running_loop()
        started = loop.time()
        faults = sim.faults.for_provider(provider.name)
        try:
            response = await _serve(sim, provider, faults, request, handler, record)
        except asyncio.CancelledError:
            record.status = 0
            record.duration = loop.time() - started
            raise
        record.status = response.status
        record.duration = loop.time() - started
        record.answered = time.monotonic()
        return response

    return middleware


async def _serve(
    sim: FrontedSimulator,
    provider: SimulatedProvider,
    faults: FaultSet,
    request: web.Request,
    handler: Handler,
    record: RequestRecord,
) -> web.StreamResponse:
    def mark(name: str) -> None:
        record.fault = name

    response: web.StreamResponse
    if faults.over_rate_limit(request.remote or ""):
        mark("rate_limit")
        return _finish(provider, faults, provider.throttled_response())
    if faults.hang:
        mark("hang")
        await _hang(sim, faults, request)
    if faults.latency > 0:
        mark("latency")
        await asyncio.sleep(faults.latency)
    if faults.take("drop"):
        mark("drop")
        _drop(request)
    if faults.take("redirect"):
        mark("redirect")
        response = web.Response(
            status=302, headers={"Location": sim.base_url + REDIRECT_TARGET}, text="Found\n"
        )
        return _finish(provider, faults, response)
    burst = faults.status_burst
    if burst is not None and faults.take("status_burst"):
        mark("status_burst")
        return _finish(provider, faults, provider.fault_response(burst[0]))
    response = await handler(request)
    if isinstance(response, web.Response) and faults.take("malformed"):
        mark("malformed")
        _corrupt(response)
    return _finish(provider, faults, response)


def _finish(
    provider: SimulatedProvider, faults: FaultSet, response: web.StreamResponse
) -> web.StreamResponse:
    provider.finish(response, faults)
    return response
