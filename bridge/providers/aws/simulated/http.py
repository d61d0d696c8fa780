"""HTTP face of the simulated EC2 IMDS under ``/latest/``, and its ``/_sim/aws/`` controls.

The vendor's rules, in the order IMDS applies them:

- ``PUT /latest/api/token``: refused (403) when it carries ``X-Forwarded-For`` (it came
  through a proxy); 400 unless ``X-aws-ec2-metadata-token-ttl-seconds`` is an integer from 1
  to 21600; otherwise the token as text, its TTL echoed in the same header. Any other method
  on the token path: 405.
- Every other request: a token that is unknown or expired is 401 (also where IMDSv1 is
  allowed); no token at all is 401 only when IMDSv2 is required (the ``v2_required`` quirk,
  off by default as in aws/amazon-ec2-metadata-mock).
- A notice path answers 404 until the notice exists (AEMM's "not found" page).

Bodies are served as ``text/plain`` like the real service (JSON included).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from bridge.simulator.attestation import b64

from .state import MAX_TOKEN_TTL

if TYPE_CHECKING:
    from bridge.simulator.server import Simulator

TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"  # noqa: S105 (a header name)


def _page(status: int, title: str) -> web.Response:
    """The XHTML error page IMDS (and AEMM) answer errors with."""
    body = (
        '<?xml version="1.0" encoding="iso-8859-1"?>\n'
        '<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN"\n'
        '\t"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">\n'
        '<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="en" lang="en">\n'
        f" <head>\n  <title>{status} - {title}</title>\n </head>\n"
        f" <body>\n  <h1>{status} - {title}</h1>\n </body>\n</html>\n"
    )
    return web.Response(status=status, body=body.encode(), content_type="text/html")


def error_page(status: int) -> web.Response:
    titles = {
        400: "Bad Request",
        401: "Unauthorized",
        403: "Forbidden",
        404: "Not Found",
        405: "Method Not Allowed",
        429: "Too Many Requests",
    }
    return _page(status, titles.get(status, "Error"))


def _text(value: str) -> web.Response:
    return web.Response(body=value.encode(), content_type="text/plain")


def _json(value: Any, pretty: bool = False) -> web.Response:
    if pretty:  # the scheduled-events layout of the vendor's example
        text = json.dumps(value, indent=2, separators=(",", " : "))
    else:
        text = json.dumps(value, separators=(",", ":"))
    return _text(text)


IDENTITY: Final = "dynamic/instance-identity/"
#: The instance the `other_vm` attestation fault names.
OTHER_VM: Final = {"instance_id": "i-0fedcba9876543210", "private_ip": "172.16.34.99"}


def identity_document(sim: Simulator) -> dict[str, Any]:
    """``/latest/dynamic/instance-identity/document`` for the simulated instance (the
    `other_vm` attestation fault: another instance's)."""
    ident = sim.identity.aws
    if sim.faults.aws.attestation == "other_vm":
        ident = replace(ident, **OTHER_VM)
    return {
        "accountId": ident.account_id,
        "architecture": "x86_64",
        "availabilityZone": ident.availability_zone,
        "billingProducts": None,
        "devpayProductCodes": None,
        "marketplaceProductCodes": None,
        "imageId": ident.image_id,
        "instanceId": ident.instance_id,
        "instanceType": ident.instance_type,
        "kernelId": None,
        "pendingTime": "2024-01-01T00:00:00Z",
        "privateIp": ident.private_ip,
        "ramdiskId": None,
        "region": ident.region,
        "version": "2017-09-30",
    }


def _document_text(sim: Simulator) -> str:
    """The document exactly as served: what `signature` and `rsa2048` sign, byte for byte.
    The `replayed` fault serves the first document this simulator served, whatever the
    instance is now (a copy taken earlier)."""
    text = json.dumps(identity_document(sim), indent=2, separators=(",", " : "))
    state = sim.aws
    if state.first_document is None:
        state.first_document = text
    return state.first_document if sim.faults.aws.attestation == "replayed" else text


def signed_identity(sim: Simulator, kind: str) -> web.Response:
    """``document``; ``signature`` (RSA SHA-256 over it); ``rsa2048`` and ``pkcs7`` (PKCS#7
    SignedData holding it; the real ``pkcs7`` is signed with DSA, the simulator's with RSA)."""
    text = _document_text(sim)
    forged = sim.faults.aws.attestation == "bad_signature"
    if kind == "document":
        return _text(text)
    if kind == "signature":
        return _text(b64(sim.signer.signature(text.encode(), forged=forged)))
    if kind in ("rsa2048", "pkcs7"):
        return _text(b64(sim.signer.pkcs7(text.encode(), forged=forged)))
    return error_page(404)


def routes(sim: Simulator) -> list[web.RouteDef]:
    async def token(request: web.Request) -> web.StreamResponse:
        if request.method != "PUT":
            return error_page(405)
        if "X-Forwarded-For" in request.headers:
            return error_page(403)
        ttl_text = request.headers.get(TTL_HEADER, "")
        ttl = int(ttl_text) if ttl_text.strip().isdigit() else 0
        if not 1 <= ttl <= MAX_TOKEN_TTL:
            return error_page(400)
        if sim.aws.quirks.token_put_timeout:
            # the answer would leave with IP TTL = hop limit and die on the way back
            await sim.stopping.wait()
            raise asyncio.CancelledError
        response = _text(sim.aws.issue_token(ttl))
        response.headers[TTL_HEADER] = str(ttl)
        return response

    def refused(request: web.Request) -> web.Response | None:
        if request.method not in ("GET", "HEAD"):
            return error_page(405)
        given = request.headers.get(TOKEN_HEADER)
        if given is not None:
            return None if sim.aws.token_valid(given) else error_page(401)
        return error_page(401) if sim.aws.quirks.v2_required else None

    def value(path: str) -> web.Response:
        state, ident = sim.aws, sim.identity.aws
        if path.startswith(IDENTITY):
            return signed_identity(sim, path.removeprefix(IDENTITY))
        fixed = {
            "meta-data/instance-id": ident.instance_id,
            "meta-data/instance-type": ident.instance_type,
            "meta-data/ami-id": ident.image_id,
            "meta-data/local-ipv4": ident.private_ip,
            "meta-data/placement/availability-zone": ident.availability_zone,
            "meta-data/placement/region": ident.region,
        }
        if path in fixed:
            return _text(fixed[path])
        if path == "meta-data/spot/instance-action" and state.spot:
            return _json(state.spot)
        if path == "meta-data/spot/termination-time" and state.spot:
            return _text(state.spot["time"])
        if path == "meta-data/events/recommendations/rebalance" and state.rebalance:
            return _json(state.rebalance)
        if path == "meta-data/events/maintenance/scheduled":
            return _json(state.scheduled(), pretty=True)
        if path == "meta-data/events/maintenance/history":
            return _json(state.past(), pretty=True)
        if path == "meta-data/autoscaling/target-lifecycle-state" and state.lifecycle:
            return _text(state.lifecycle)
        return error_page(404)

    async def metadata(request: web.Request) -> web.StreamResponse:
        error = refused(request)
        if error is not None:
            return error
        return value(request.match_info["tail"].strip("/"))

    return [
        web.route("*", "/latest/api/token", token),
        web.route("*", "/latest/{tail:.*}", metadata),
    ]


def control_routes(sim: Simulator) -> list[web.RouteDef]:
    """``/_sim/aws/...``: drive the AWS notices live (JSON in and out)."""

    async def body_of(request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        body = json.loads(raw) if raw.strip() else {}
        if not isinstance(body, dict):
            raise ValueError("body must be a JSON object")
        return body

    def guard(handler: Any) -> Any:
        async def wrapped(request: web.Request) -> web.StreamResponse:
            try:
                result = await handler(request)
            except KeyError as exc:
                return web.json_response({"error": f"unknown: {exc}"}, status=404)
            except (ValueError, TypeError) as exc:
                return web.json_response({"error": str(exc)}, status=400)
            return web.json_response(sim.aws.snapshot() if result is None else result)

        return wrapped

    async def spot(request: web.Request) -> Any:
        if request.method == "DELETE":
            return sim.aws.clear_spot()
        return sim.aws.interrupt(**await body_of(request))

    async def rebalance(request: web.Request) -> Any:
        if request.method == "DELETE":
            return sim.aws.clear_rebalance()
        return sim.aws.recommend_rebalance()

    async def add_event(request: web.Request) -> Any:
        return {"EventId": sim.aws.add_event(**await body_of(request))}

    async def change_event(request: web.Request) -> Any:
        event_id, action = request.match_info["event_id"], request.match_info["action"]
        if action == "complete":
            sim.aws.complete_event(event_id)
        elif action == "cancel":
            sim.aws.cancel_event(event_id)
        elif action == "state":
            sim.aws.set_event_state(event_id, str((await body_of(request))["state"]))
        else:
            raise KeyError(action)

    async def remove_event(request: web.Request) -> Any:
        sim.aws.remove_event(request.match_info["event_id"])

    async def lifecycle(request: web.Request) -> Any:
        sim.aws.set_lifecycle((await body_of(request)).get("state"))

    async def expire_tokens(request: web.Request) -> Any:
        return {"expired": sim.aws.expire_tokens()}

    async def state(request: web.Request) -> Any:
        return None

    routes = [
        ("GET", "/_sim/aws", state),
        ("POST", "/_sim/aws/spot", spot),
        ("DELETE", "/_sim/aws/spot", spot),
        ("POST", "/_sim/aws/rebalance", rebalance),
        ("DELETE", "/_sim/aws/rebalance", rebalance),
        ("POST", "/_sim/aws/events", add_event),
        ("POST", "/_sim/aws/events/{event_id}/{action}", change_event),
        ("DELETE", "/_sim/aws/events/{event_id}", remove_event),
        ("POST", "/_sim/aws/lifecycle", lifecycle),
        ("POST", "/_sim/aws/tokens/expire", expire_tokens),
    ]
    return [web.route(method, path, guard(handler)) for method, path, handler in routes]
