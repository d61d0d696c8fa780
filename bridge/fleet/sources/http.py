"""The `http` source: `POST /v1/events`, exactly what the sidecars' webhook sink sends.

A small fleet needs no bus: point each sidecar's webhook sink at the fleet service.

- Content modes of the CloudEvents HTTP binding: structured
  (`application/cloudevents+json`), batch (`application/cloudevents-batch+json`) and binary
  (`ce-*` headers, the data as the body). Anything else is 415.
- Authentication, checked before the body is parsed: Standard Webhooks signatures
  (`webhook-id`, `webhook-timestamp` within `tolerance` of now, `webhook-signature` with a
  `v1,` HMAC-SHA256 over `id.timestamp.body`) against every configured secret, so during a
  rotation either the old or the new one verifies; or `Authorization: Bearer <token>`.
  Missing or wrong: 401. No secret and no token: unsigned posts, allowed only on a loopback
  listener (the configuration refuses anything else).
- A body over `max_body` bytes: 413, before it is read.
- The answer comes after the store's commit: 200 with the counts when every event was
  valid (new or already known: a retried delivery is a success), 400 naming each refused
  event and its reason otherwise. The valid events of a partly refused batch are committed
  (they are safe to keep; the rest are in the rejected table), so the sink's later replay
  of the batch doubles nothing.
- The store failing: 503 with Retry-After, and the sink retries.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import time
from typing import Final

from aiohttp import web

from bridge import contract
from bridge.fleet.config import HttpSourceConfig
from bridge.fleet.identity.gate import IdentityGate
from bridge.fleet.identity.screen import screen
from bridge.fleet.sources.base import Ingestor, SourceHealth, classify
from bridge.fleet.store import Accepted, Refused, StoreError
from bridge.infra.credential import HEADER as CREDENTIAL_HEADER
from sinks import _webhook_signing as signing

log = logging.getLogger("bridge.fleet.http")

PATH: Final = "/v1/events"
STRUCTURED: Final = "application/cloudevents+json"
BATCH: Final = "application/cloudevents-batch+json"
#: Refused events named in one 400 answer, at most.
REASONS_SHOWN: Final = 20


def _bad(status: int, reason: str, **extra: object) -> web.Response:
    return web.json_response({"error": reason, **extra}, status=status)


class HttpSource:
    """`POST /v1/events` on the fleet listener (see the module docstring)."""

    def __init__(self, config: HttpSourceConfig, identity: IdentityGate | None = None) -> None:
        self.name = config.name
        self.identity = identity
        self._config = config
        self._keys = [signing.standard_key(s.get_secret_value()) for s in config.all_secrets()]
        self._ingestor: Ingestor | None = None
        self.requests = 0

    def __repr__(self) -> str:
        return f"HttpSource(name={self.name!r}, secrets={len(self._keys)})"

    async def start(self, ingestor: Ingestor) -> None:
        self._ingestor = ingestor

    async def stop(self) -> None:
        self._ingestor = None

    def health(self) -> SourceHealth:
        if self._ingestor is None:
            return SourceHealth(False, "not started")
        return SourceHealth(True, f"POST {PATH}: {self.requests} request(s)")

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post(PATH, self.handle)

    # -- authentication ---------------------------------------------------------------------

    def _authentic(self, request: web.Request, body: bytes) -> str | None:
        """None when the request is authentic, else why not (for the 401 answer)."""
        token = self._config.token
        if token is not None:
            given = request.headers.get("authorization", "").encode()
            if hmac.compare_digest(given, f"Bearer {token.get_secret_value()}".encode()):
                return None
            if not self._keys:
                return "missing or wrong bearer token"
        if not self._keys:
            return None  # unsigned posts: a loopback listener only (see the configuration)
        msg_id = request.headers.get("webhook-id")
        stamp = request.headers.get("webhook-timestamp", "")
        signatures = request.headers.get("webhook-signature", "")
        if not msg_id or not stamp or not signatures:
            return "unsigned: webhook-id, webhook-timestamp and webhook-signature are required"
        if not stamp.isdigit() or abs(time.time() - int(stamp)) > self._config.tolerance:
            return "webhook-timestamp is missing, malformed or too far from now"
        signed = f"{msg_id}.{stamp}.".encode() + body
        candidates = [
            part.removeprefix("v1,").encode()
            for part in signatures.split()
            if part.startswith("v1,")
        ]
        for key in self._keys:
            expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest())
            if any(hmac.compare_digest(expected, candidate) for candidate in candidates):
                return None
        return "no signature matches a configured secret"

    # -- the request ------------------------------------------------------------------------

    @staticmethod
    def _bodies(request: web.Request, body: bytes) -> list[bytes]:
        """The structured JSON of each event in the request; `ContractError` if unreadable."""
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type == BATCH:
            return contract.split_batch(body)
        if content_type == STRUCTURED:
            return [body]
        if "ce-specversion" in request.headers:
            return [contract.binary_to_structured(request.headers, body)]
        raise _Unsupported(content_type or "none")

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        ingestor = self._ingestor
        if ingestor is None:
            return _bad(503, "the fleet service is starting or stopping")
        length = request.content_length
        if length is not None and length > self._config.max_body:
            ingestor.stats.refused(self.name)
            return _bad(413, f"body larger than {self._config.max_body} bytes")
        body: bytes | None
        try:
            body = await request.read()  # bounded by the application's client_max_size
        except web.HTTPRequestEntityTooLarge:
            body = None  # chunked, and longer than any source takes
        if body is None or len(body) > self._config.max_body:
            ingestor.stats.refused(self.name)
            return _bad(413, f"body larger than {self._config.max_body} bytes")
        why = self._authentic(request, body)
        if why is not None:
            log.warning("POST %s from %s refused: %s", PATH, request.remote, why)
            return _bad(401, why)
        try:
            bodies = self._bodies(request, body)
        except _Unsupported as exc:
            ingestor.stats.refused(self.name)
            return _bad(
                415, f"content type {exc} is not a CloudEvents structured, batch or binary mode"
            )
        except contract.ContractError as exc:
            return await self._commit(ingestor, [], [(0, Refused(body, str(exc)))])
        accepted, refused = classify(bodies)
        # instance identity (bridge/fleet/identity/): 401/403, the refused kept in `rejected`
        gated = screen(self.identity, request.headers.get(CREDENTIAL_HEADER), accepted, refused)
        return await self._commit(ingestor, gated.accepted, gated.refused, gated.status)

    async def _commit(
        self,
        ingestor: Ingestor,
        accepted: list[Accepted],
        refused: list[tuple[int, Refused]],
        status: int = 400,
    ) -> web.Response:
        try:
            result = await ingestor.commit(self.name, accepted, [r for _, r in refused])
        except StoreError as exc:
            log.error("POST %s: cannot commit: %s", PATH, exc)
            return web.json_response(
                {"error": "the fleet store cannot commit now; retry"},
                status=503,
                headers={"Retry-After": "5"},
            )
        counts = {
            "accepted": result.accepted,
            "duplicate": result.duplicate,
            "invalid": result.invalid,
        }
        if refused:
            reasons = [{"index": i, "reason": r.reason} for i, r in refused[:REASONS_SHOWN]]
            first = refused[0][1].reason
            return _bad(status or 400, f"refused: {first}", refused=reasons, **counts)
        return web.json_response(counts)


class _Unsupported(Exception):
    """The request's content type is no CloudEvents HTTP content mode."""
