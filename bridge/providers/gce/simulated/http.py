"""HTTP face of the simulated GCE metadata server (``/computeMetadata/v1/...``).

Implements the request rules of metadata-services.md: the ``Metadata-Flavor`` check, the
X-Forwarded-For rejection, directory listings (text, ``alt=json``, ``recursive=true``), and
long polling with ``wait_for_change`` / ``last_etag`` / ``timeout_sec``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from aiohttp import web

from bridge.simulator.control import ok, read_body, routes_of

from .state import MAINTENANCE_KEY, GceState, Rendered

if TYPE_CHECKING:
    from bridge.simulator.server import Simulator

PREFIX = "/computeMetadata/v1"
IDENTITY_KEY = "instance/service-accounts/default/identity"
#: The VM the `other_vm` attestation fault names.
OTHER_VM = {"instance_id": 7310991843529155117, "instance_name": "sim-vm-other"}

_ERROR_PAGE = """<!DOCTYPE html>
<html lang=en>
  <meta charset=utf-8>
  <title>Error {status} ({reason})!!1</title>
  <p><b>{status}.</b> <ins>That's an error.</ins>
  <p>{message} <ins>That's all we know.</ins>
"""


def _state(sim: Simulator) -> GceState:
    """The simulator's GCE state now (a scenario load replaces it)."""
    return sim.state_of("gce", GceState)


def error_page(status: int, message: str) -> web.Response:
    """Google-style HTML error page (403 and 404 on the real server are HTML)."""
    reason = {400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed"}
    body = _ERROR_PAGE.format(status=status, reason=reason.get(status, "Error"), message=message)
    return web.Response(
        status=status, body=body.encode(), headers={"Content-Type": "text/html; charset=UTF-8"}
    )


def _not_found(path: str) -> web.Response:
    return error_page(404, f"The requested URL <code>{path}</code> was not found on this server.")


def _text(body: str, status: int = 200) -> web.Response:
    return web.Response(
        status=status, body=body.encode(), headers={"Content-Type": "application/text"}
    )


def _redirect_with_slash(request: web.Request) -> web.Response:
    location = request.path + "/" + (f"?{request.query_string}" if request.query_string else "")
    return web.Response(status=301, headers={"Location": location}, body=b"")


def _to_response(rendered: Rendered | None, path: str, alt_json: bool) -> web.Response:
    if rendered is None:
        return _not_found(path)
    if rendered.status == 404:
        return _not_found(path)
    body, ctype = rendered.body, rendered.content_type
    if alt_json and ctype == "application/text" and rendered.status == 200:
        body, ctype = json.dumps(body), "application/json"
    response = web.Response(
        status=rendered.status, body=body.encode(), headers={"Content-Type": ctype}
    )
    if rendered.status == 200:
        response.headers["ETag"] = rendered.tag
    return response


async def _long_poll(
    sim: Simulator,
    render: Callable[[], Rendered | None],
    last_etag: str | None,
    timeout_sec: int | None,
) -> Rendered | None:
    """Hang until the representation's tag differs from ``last_etag`` (or from the tag at
    arrival), the timeout passes (real seconds: it is an HTTP timeout), or the server stops."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout_sec is None else loop.time() + timeout_sec
    first = render()
    baseline = last_etag if last_etag is not None else (first.tag if first else None)
    while True:
        current = render()
        current_tag = current.tag if current else None
        if current_tag != baseline or sim.stopping.is_set():
            return current
        remaining = None if deadline is None else deadline - loop.time()
        if remaining is not None and remaining <= 0:
            return current
        changed = asyncio.ensure_future(sim.signal.current.wait())
        stopped = asyncio.ensure_future(sim.stopping.wait())
        try:
            await asyncio.wait(
                {changed, stopped}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            changed.cancel()
            stopped.cancel()


def _flag(value: str | None) -> bool:
    return value is not None and value.lower() == "true"


def identity_token(sim: Simulator, query: Mapping[str, str]) -> web.Response:
    """``instance/service-accounts/default/identity``: a Google-signed (here: the simulator's
    key) RS256 JWT for `audience`, valid one hour; with ``format=full`` it names the instance
    in ``google.compute_engine``. No service account on the VM: 404, as the real server."""
    ident = sim.identity.gce
    email = ident.service_account_email
    if not email:
        return _not_found(f"{PREFIX}/{IDENTITY_KEY}")
    audience = query.get("audience", "")
    if not audience:
        return error_page(400, "non-empty audience parameter required")
    fault = sim.faults.gce.attestation
    if fault == "other_vm":
        ident = replace(ident, **OTHER_VM)
    now = int(time.time())
    issued = now - 7200 if fault == "expired" else now
    claims: dict[str, object] = {
        "aud": "https://not-the-fleet.invalid" if fault == "wrong_audience" else audience,
        "azp": str(100000000000000000000 + ident.project_number),
        "email": email,
        "email_verified": True,
        "exp": issued + 3600,
        "iat": issued,
        "iss": "https://accounts.google.com",
        "sub": str(100000000000000000000 + ident.project_number),
    }
    if query.get("format") == "full":
        claims["google"] = {
            "compute_engine": {
                "instance_creation_timestamp": 1704067200,
                "instance_id": str(ident.instance_id),
                "instance_name": ident.instance_name,
                "project_id": ident.project_id,
                "project_number": ident.project_number,
                "zone": ident.zone,
            }
        }
    return _text(sim.signer.jwt(claims, forged=fault == "bad_signature"))


def routes(sim: Simulator) -> list[web.RouteDef]:
    async def handle(request: web.Request) -> web.StreamResponse:
        path = request.path
        if "X-Forwarded-For" in request.headers:
            return error_page(403, "Requests with an X-Forwarded-For header are not allowed.")
        if request.headers.get("Metadata-Flavor") != "Google":
            return error_page(
                403,
                f"Your client does not have permission to get URL <code>{path}</code> from "
                "this server. Missing Metadata-Flavor:Google header.",
            )
        if request.method not in ("GET", "HEAD"):
            return error_page(405, f"The request method {request.method} is inappropriate.")
        if path == "/":
            return _text("computeMetadata/\n")
        if path == "/computeMetadata":
            return _redirect_with_slash(request)
        if path == "/computeMetadata/":
            return _text("v1/\n")
        if path != PREFIX and not path.startswith(PREFIX + "/"):
            return _not_found(path)
        if path == PREFIX:
            return _redirect_with_slash(request)
        raw_key = path[len(PREFIX) + 1 :]
        trailing = raw_key.endswith("/") or raw_key == ""
        key = raw_key.strip("/")
        if key == MAINTENANCE_KEY and not trailing:
            # only a direct query counts for the 60-second warning, not a parent directory
            _state(sim).mark_watched()

        query = request.query
        if key == IDENTITY_KEY and not trailing:
            return identity_token(sim, query)
        wait = _flag(query.get("wait_for_change"))
        last_etag = query.get("last_etag")
        recursive = _flag(query.get("recursive"))
        alt_json = query.get("alt", "").lower() == "json"
        timeout: int | None = None
        if "timeout_sec" in query:
            try:
                timeout = int(query["timeout_sec"])
            except ValueError:
                return error_page(400, "timeout_sec must be an integer.")
            if timeout < 0:
                return error_page(400, "timeout_sec must be >= 0.")

        is_dir = key == "" or _state(sim).is_dir(key)
        render: Callable[[], Rendered | None]
        if is_dir:
            if not trailing:
                return _redirect_with_slash(request)
            if wait and not recursive:
                return error_page(
                    400, "Non-recursive directories listings do not support wait_for_change."
                )
            as_json = alt_json or (recursive and query.get("alt", "").lower() != "text")

            def render() -> Rendered | None:
                if not (key == "" or _state(sim).is_dir(key)):
                    return None
                return _state(sim).render_dir(key, recursive=recursive, as_json=as_json)

        else:
            if trailing or not _state(sim).has_value(key):
                return _not_found(path)

            def render() -> Rendered | None:
                return _state(sim).render_value(key)

        rendered = await _long_poll(sim, render, last_etag, timeout) if wait else render()
        return _to_response(rendered, path, alt_json and not is_dir)

    return [web.route("*", "/{tail:.*}", handle)]


def control_routes(sim: Simulator) -> list[web.RouteDef]:
    """``/_sim/gce/...``: set, delete and schedule metadata values live (JSON in and out)."""

    async def gce_set(request: web.Request) -> web.StreamResponse:
        body = await read_body(request)
        if not isinstance(body, dict) or "key" not in body or "value" not in body:
            raise ValueError('body must be {"key": ..., "value": ...}')
        _state(sim).set(str(body["key"]), str(body["value"]))
        return ok()

    async def gce_delete(request: web.Request) -> web.StreamResponse:
        body = await read_body(request)
        if not isinstance(body, dict) or "key" not in body:
            raise ValueError('body must be {"key": ...}')
        _state(sim).delete(str(body["key"]))
        return ok()

    async def gce_upcoming(request: web.Request) -> web.StreamResponse:
        body = await read_body(request)
        if body is not None and not isinstance(body, dict):
            raise ValueError("body must be an object or null")
        _state(sim).set_upcoming_maintenance(body)
        return ok()

    return routes_of(
        [
            ("POST", "/_sim/gce/set", gce_set),
            ("POST", "/_sim/gce/delete", gce_delete),
            ("POST", "/_sim/gce/upcoming", gce_upcoming),
        ]
    )
