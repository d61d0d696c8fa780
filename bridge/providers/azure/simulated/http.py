"""HTTP face of the simulated Azure IMDS: ``/metadata/scheduledevents`` and
``/metadata/instance``.

Validation order: X-Forwarded-For, ``Metadata: true``, then api-version, each a 400 with a
JSON ``error`` body as IMDS answers (IMDS documents only 400 for request errors, so the
X-Forwarded-For rejection is a 400 too).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from base64 import b64encode
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from bridge.simulator.control import ok, read_body, routes_of

from .state import SCHEDULED_EVENTS_VERSIONS

if TYPE_CHECKING:
    from bridge.simulator.server import Simulator

INSTANCE_VERSIONS = (
    "2017-03-01", "2017-04-02", "2017-08-01", "2017-10-01", "2017-12-01", "2018-02-01",
    "2018-04-02", "2018-10-01", "2019-02-01", "2019-03-11", "2019-04-30", "2019-06-01",
    "2019-06-04", "2019-08-01", "2019-08-15", "2019-11-01", "2020-06-01", "2020-07-15",
    "2020-09-01", "2020-10-01", "2020-12-01", "2021-01-01", "2021-02-01", "2021-03-01",
    "2021-05-01", "2021-10-01", "2021-11-01", "2021-11-15", "2021-12-13", "2023-07-01",
)  # fmt: skip
#: The token endpoint's and the attested document's versions (from 2018-02-01, 2018-10-01).
TOKEN_VERSIONS = tuple(v for v in INSTANCE_VERSIONS if v >= "2018-02-01")
ATTESTED_VERSIONS = tuple(v for v in INSTANCE_VERSIONS if v >= "2018-10-01")
#: The VM the `other_vm` attestation fault names.
OTHER_VM = {"name": "sim-vm-other", "vm_id": "5c0d1b7e-9a31-4f7e-b1f4-0e8a6c2d9f35"}
_NONCE = re.compile(r"[0-9]{1,10}")
MISSING_HEADER = {"error": "Bad request: . Required metadata header not specified"}
XFF_REJECTED = {"error": "Bad request. X-Forwarded-For header is not allowed"}


def json_response(status: int, payload: object) -> web.Response:
    """Azure-style compact JSON answer."""
    return web.Response(
        status=status,
        body=json.dumps(payload, separators=(",", ":")).encode(),
        headers={"Content-Type": "application/json; charset=utf-8"},
    )


def _version_error(present: bool, newest: tuple[str, ...]) -> web.Response:
    reason = "was not specified" if not present else "is invalid or was not specified"
    return json_response(
        400,
        {
            "error": f"Bad request. api-version {reason} in the request. For more information "
            "refer to aka.ms/azureimds",
            "newest-versions": sorted(newest, reverse=True)[:3],
        },
    )


def instance_document(sim: Simulator) -> dict[str, Any]:
    """A realistic ``/metadata/instance`` body for the simulated VM."""
    ident = sim.identity.azure
    return {
        "compute": {
            "azEnvironment": "AzurePublicCloud",
            "location": ident.location,
            "name": ident.name,
            "offer": "0001-com-ubuntu-server-jammy",
            "osType": ident.os_type,
            "priority": "Regular",
            "provider": "Microsoft.Compute",
            "publisher": "canonical",
            "resourceGroupName": ident.resource_group_name,
            "resourceId": ident.resource_id,
            "sku": "22_04-lts-gen2",
            "subscriptionId": ident.subscription_id,
            "tags": "",
            "version": "22.04.202404080",
            "vmId": ident.vm_id,
            "vmScaleSetName": ident.vm_scale_set_name,
            "vmSize": ident.vm_size,
            "zone": ident.zone,
        },
        "network": {
            "interface": [
                {
                    "ipv4": {
                        "ipAddress": [{"privateIpAddress": "10.0.0.4", "publicIpAddress": ""}],
                        "subnet": [{"address": "10.0.0.0", "prefix": "24"}],
                    },
                    "ipv6": {"ipAddress": []},
                    "macAddress": "000D3A8C1B2E",
                }
            ]
        },
    }


def _stamp(epoch: float) -> str:
    """The attested document's time format, `11/28/23 00:36:32 -0000`."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%m/%d/%y %H:%M:%S -0000")


def managed_identity_token(sim: Simulator, resource: str) -> web.Response:
    """``/metadata/identity/oauth2/token``: an access token for `resource` whose
    ``xms_mirid`` is the VM's resource id (signed with the simulator's key)."""
    ident = sim.identity.azure
    if not ident.managed_identity:
        return json_response(
            400, {"error": "invalid_request", "error_description": "Identity not found"}
        )
    fault = sim.faults.azure.attestation
    if fault == "other_vm":
        ident = replace(ident, **OTHER_VM)
    mirid = ident.resource_id
    if fault == "wrong_resource":
        mirid = mirid.replace(
            f"/resourceGroups/{ident.resource_group_name}/", "/resourceGroups/other-rg/"
        )
    now = int(time.time())
    issued = now - 90000 if fault == "expired" else now
    expires = issued + 86400
    issuer = f"https://sts.windows.net/{ident.tenant_id}/"
    principal = "c7f3b1a2-5d4e-4f60-8a9b-1c2d3e4f5a6b"
    claims = {
        "aud": "https://not-the-fleet.invalid" if fault == "wrong_audience" else resource,
        "iss": issuer,
        "iat": issued,
        "nbf": issued,
        "exp": expires,
        "aio": "sim",
        "appid": "9a8b7c6d-5e4f-4a3b-2c1d-0e9f8a7b6c5d",
        "appidacr": "2",
        "idp": issuer,
        "oid": principal,
        "sub": principal,
        "tid": ident.tenant_id,
        "ver": "1.0",
        "xms_mirid": mirid,
    }
    return json_response(
        200,
        {
            "access_token": sim.signer.jwt(claims, forged=fault == "bad_signature"),
            "client_id": claims["appid"],
            "expires_in": str(expires - now),
            "expires_on": str(expires),
            "ext_expires_in": str(expires - now),
            "not_before": str(issued),
            "resource": resource,
            "token_type": "Bearer",
        },
    )


def attested_document(sim: Simulator, nonce: str) -> web.Response:
    """``/metadata/attested/document``: vmId, subscription and the nonce, PKCS#7-signed by a
    certificate of the simulator's CA (Azure's: metadata.azure.com)."""
    ident = sim.identity.azure
    fault = sim.faults.azure.attestation
    if fault == "other_vm":
        ident = replace(ident, **OTHER_VM)
    now = time.time()
    created = now - 86400 if fault == "expired" else now
    content = {
        "licenseType": "",
        "nonce": "0000000000" if fault == "wrong_audience" else nonce,
        "plan": {"name": "", "product": "", "publisher": ""},
        "sku": "22_04-lts-gen2",
        "subscriptionId": ident.subscription_id,
        "timeStamp": {"createdOn": _stamp(created), "expiresOn": _stamp(created + 6 * 3600)},
        "vmId": ident.vm_id,
    }
    signed = sim.signer.pkcs7(
        json.dumps(content, separators=(",", ":")).encode(), forged=fault == "bad_signature"
    )
    return json_response(200, {"encoding": "pkcs7", "signature": b64encode(signed).decode()})


def _parse_start_requests(raw: bytes) -> list[str] | None:
    """EventIds of a ``{"StartRequests": [{"EventId": ...}]}`` body, None if malformed."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(body, dict) or not isinstance(body.get("StartRequests"), list):
        return None
    ids: list[str] = []
    for item in body["StartRequests"]:
        if not isinstance(item, dict) or not isinstance(item.get("EventId"), str):
            return None
        ids.append(item["EventId"])
    return ids or None


def routes(sim: Simulator) -> list[web.RouteDef]:
    def precheck(request: web.Request, versions: tuple[str, ...]) -> web.Response | None:
        if "X-Forwarded-For" in request.headers:
            return json_response(400, XFF_REJECTED)
        if request.headers.get("Metadata", "").lower() != "true":
            return json_response(400, MISSING_HEADER)
        version = request.query.get("api-version")
        if version not in versions:
            return _version_error(version is not None, versions)
        return None

    async def scheduled_events(request: web.Request) -> web.StreamResponse:
        error = precheck(request, SCHEDULED_EVENTS_VERSIONS)
        if error is not None:
            return error
        state = sim.azure
        if not state.first_call_done:
            # the service enables itself on first use, which can take up to two minutes
            state.first_call_done = True
            if state.quirks.first_call_delay > 0:
                stopped = asyncio.ensure_future(sim.stopping.wait())
                try:
                    await asyncio.wait({stopped}, timeout=state.quirks.first_call_delay)
                finally:
                    stopped.cancel()
        api_version = request.query["api-version"]
        if request.method == "GET":
            return json_response(200, state.document(api_version))
        if request.method != "POST":
            return json_response(405, {"error": "Method not allowed"})
        ids = _parse_start_requests(await request.read())
        if ids is None:
            return json_response(400, {"error": "Bad request. Malformed StartRequests body"})
        if not state.approve(ids, request.remote or "", request.headers.get("User-Agent", "")):
            status = state.quirks.unknown_approval_status
            if status == 200:
                return web.Response(status=200, body=b"")
            return json_response(status, {"error": "Bad request. Unknown or expired EventId"})
        return web.Response(status=200, body=b"")

    async def instance(request: web.Request) -> web.StreamResponse:
        error = precheck(request, INSTANCE_VERSIONS)
        if error is not None:
            return error
        if request.method != "GET":
            return json_response(405, {"error": "Method not allowed"})
        node: Any = instance_document(sim)
        parts = [p for p in request.match_info.get("tail", "").split("/") if p]
        for part in parts:
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return json_response(404, {"error": "Not found"})
        fmt = request.query.get("format", "json" if isinstance(node, dict | list) else "text")
        if fmt == "text":
            if isinstance(node, dict):
                text = "\n".join(node)
            elif isinstance(node, list):
                text = "\n".join(str(i) for i in range(len(node)))
            else:
                text = str(node)
            return web.Response(
                body=text.encode(), headers={"Content-Type": "text/plain; charset=utf-8"}
            )
        if fmt != "json":
            return json_response(400, {"error": "Bad request. Invalid format"})
        return json_response(200, node)

    async def token(request: web.Request) -> web.StreamResponse:
        error = precheck(request, TOKEN_VERSIONS)
        if error is not None:
            return error
        resource = request.query.get("resource", "")
        if not resource:
            return json_response(
                400,
                {
                    "error": "invalid_request",
                    "error_description": "Required query variable 'resource' is missing",
                },
            )
        return managed_identity_token(sim, resource)

    async def attested(request: web.Request) -> web.StreamResponse:
        error = precheck(request, ATTESTED_VERSIONS)
        if error is not None:
            return error
        nonce = request.query.get("nonce", str(int(time.time())))
        if not _NONCE.fullmatch(nonce):
            return json_response(400, {"error": "Bad request. Nonce must be up to 10 digits"})
        return attested_document(sim, nonce)

    async def not_found(request: web.Request) -> web.StreamResponse:
        return json_response(404, {"error": "Not found"})

    return [
        web.route("*", "/metadata/scheduledevents", scheduled_events),
        web.route("*", "/metadata/instance", instance),
        web.route("*", "/metadata/instance/{tail:.*}", instance),
        web.route("GET", "/metadata/identity/oauth2/token", token),
        web.route("GET", "/metadata/attested/document", attested),
        web.route("*", "/metadata{tail:.*}", not_found),
    ]


def control_routes(sim: Simulator) -> list[web.RouteDef]:
    """``/_sim/azure/events...``: add, list, start and remove events live (JSON in and out)."""

    async def azure_add(request: web.Request) -> web.StreamResponse:
        body = await read_body(request) or {}
        if not isinstance(body, dict):
            raise ValueError("body must be an object of add_event arguments")
        event_id = sim.azure.add_event(**body)
        return ok({"EventId": event_id, "DocumentIncarnation": sim.azure.incarnation}, 201)

    async def azure_list(request: web.Request) -> web.StreamResponse:
        return ok({"DocumentIncarnation": sim.azure.incarnation, "Events": sim.azure.events})

    async def azure_start(request: web.Request) -> web.StreamResponse:
        sim.azure.start_event(request.match_info["event_id"])
        return ok({"DocumentIncarnation": sim.azure.incarnation})

    async def azure_remove(request: web.Request) -> web.StreamResponse:
        sim.azure.remove_event(request.match_info["event_id"])
        return ok({"DocumentIncarnation": sim.azure.incarnation})

    return routes_of(
        [
            ("GET", "/_sim/azure/events", azure_list),
            ("POST", "/_sim/azure/events", azure_add),
            ("POST", "/_sim/azure/events/{event_id}/start", azure_start),
            ("DELETE", "/_sim/azure/events/{event_id}", azure_remove),
        ]
    )
