"""The `http` source: `POST /v1/events`, exactly what the sidecars' webhook sink sends.

A small fleet needs no bus: point each sidecar's webhook sink at the fleet service.

- Content modes of the CloudEvents HTTP binding: structured
  (`application/cloudevents+json`), batch (`application/cloudevents-batch+json`) and binary
  (`ce-*` headers, the data as the body). Anything else is 415.
- Authentication, from the headers before any body byte is read: `Authorization: Bearer`
  with an `ingest` credential (the source's `token` or `[[fleet.auth.credentials]]`), or
  Standard Webhooks signatures (`webhook-id`, `webhook-timestamp` within `tolerance` of now,
  `webhook-signature`) against every configured secret, so during a rotation either the old
  or the new one verifies. A missing, malformed, stale or unknown credential is 401 at once
  (and the connection closed, its body unread); a read credential is 403. The signature is
  then computed as the body streams in. Structured and batch mode sign `id.timestamp.body`
  (`v1,`); binary mode must sign the `ce-*` attributes too (`v1ce,`, see
  `bridge.transports.webhook_signing`), unless `binary_unsigned_attributes` takes old
  sidecars' `v1`.
  No secret and no token: unsigned posts, allowed only on a loopback listener (the
  configuration refuses anything else). Failed credentials count towards the address's
  429 (`bridge.fleet.auth.FailureLimiter`).
- A body over `max_body` bytes: 413, from Content-Length before it is read, or as it
  streams. Body bytes held across all requests are capped by `max_in_flight`: past it, 503
  with Retry-After. A body not in within `body_timeout` is 408, so a slow sender (whose
  signature cannot be checked before its last byte) holds its share of the cap that long.
- The answer comes after the store's commit: 200 with the counts when every event was
  valid (new or already known: a retried delivery is a success), 400 naming each refused
  event and its reason otherwise. The valid events of a partly refused batch are committed
  (they are safe to keep; the rest are in the rejected table), so the sink's later replay
  of the batch doubles nothing.
- The commit is grouped with other requests' (`bridge.fleet.group_commit`): many posts, one
  transaction, each answered after it committed. More than `[fleet.ingest] max_queued`
  events waiting for the store: 503 with Retry-After, at once (back-pressure in a burst).
- The store failing: 503 with Retry-After, and the sink retries (every request of the
  failed transaction).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

import msgspec
from aiohttp import web

from bridge import contract
from bridge.fleet import bounds
from bridge.fleet.auth import AccessGuard, Refusal, bearer, too_many, unauthorized
from bridge.fleet.auth_config import FleetAuth
from bridge.fleet.config import HttpSourceConfig
from bridge.fleet.group_commit import Overloaded
from bridge.fleet.identity.gate import IdentityGate
from bridge.fleet.identity.screen import screen
from bridge.fleet.ingest_log import BODY
from bridge.fleet.sources.base import Ingestor, SourceHealth, classify
from bridge.fleet.store import Accepted, Refused, StoreError
from bridge.infra.credential import HEADER as CREDENTIAL_HEADER
from bridge.transports import webhook_signing as signing

log = logging.getLogger("bridge.fleet.http")

PATH: Final = "/v1/events"
STRUCTURED: Final = "application/cloudevents+json"
BATCH: Final = "application/cloudevents-batch+json"
BINARY: Final = "binary"
#: Refused events named in one 400 answer, at most.
REASONS_SHOWN: Final = 20
#: Bytes read from the body at a time (each chunk goes into the signature's HMAC).
CHUNK: Final = 64 * 1024
#: The 200 answer's encoder (msgspec: a few times faster than `json.dumps`, which every
#: one-event post would pay).
_JSON: Final = msgspec.json.Encoder()


def _bad(status: int, reason: str, **extra: object) -> web.Response:
    return web.json_response({"error": reason, **extra}, status=status)


class BodyBudget:
    """Body bytes held at once across all requests of a source, at most `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, count: int) -> bool:
        if self.held + count > self.limit:
            return False
        self.held += count
        return True

    def give(self, count: int) -> None:
        self.held -= count


class _Hold:
    """The bytes one request holds of a `BodyBudget`, all given back by `release`."""

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.held = 0

    def take(self, count: int) -> bool:
        if not self.budget.take(count):
            return False
        self.held += count
        return True

    def release(self) -> None:
        self.budget.give(self.held)
        self.held = 0


class HttpSource:
    """`POST /v1/events` on the fleet listener (see the module docstring)."""

    def __init__(
        self,
        config: HttpSourceConfig,
        guard: AccessGuard | None = None,
        identity: IdentityGate | None = None,
    ) -> None:
        self.name = config.name
        self.identity = identity
        self._config = config
        self._keys = [signing.standard_key(s.get_secret_value()) for s in config.all_secrets()]
        tokens = [(f"{config.name}.token", config.token)] if config.token is not None else []
        self._guard = guard or AccessGuard(FleetAuth(), loopback=True, ingest_tokens=tokens)
        self._open = not self._keys and not self._guard.book.has("ingest")
        self._budget = BodyBudget(config.max_in_flight)
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

    # -- authentication, from the headers ---------------------------------------------------

    def _credential(self, request: web.Request, mode: str) -> signing.Verification | None:
        """None when the headers alone show the request authentic (an ingest token, or an
        open loopback source); the signature to check as the body streams in; `Refusal`."""
        token = bearer(request)
        if token is not None:
            holder = self._guard.book.find(token)
            if holder is not None and "ingest" in holder.scopes:
                return None
            if holder is not None:
                raise Refusal(f"the credential {holder.name!r} does not grant ingest", "scope")
            if not self._keys or "webhook-signature" not in request.headers:
                raise Refusal("unknown bearer token", "unknown")
        if not self._keys:
            if self._open:
                return None  # unsigned posts: a loopback listener only (see the configuration)
            raise Refusal("missing credential: an ingest bearer token is required", "missing")
        return self._signature(request, mode)

    def _signature(self, request: web.Request, mode: str) -> signing.Verification:
        try:
            return signing.verification(
                request.headers,
                self._keys,
                binary=mode == BINARY,
                body_only_in_binary=self._config.binary_unsigned_attributes,
                tolerance=self._config.tolerance,
                now=time.time(),
            )
        except signing.SignatureError as exc:
            raise Refusal(str(exc), exc.kind) from None

    def _refuse(self, request: web.Request, refusal: Refusal) -> web.Response:
        log.warning("POST %s from %s refused: %s", PATH, request.remote, refusal)
        if refusal.kind == "scope":
            return _bad(403, str(refusal))
        self._guard.limiter.failed(request.remote, refusal.kind)
        return unauthorized(str(refusal))

    # -- the request ------------------------------------------------------------------------

    @staticmethod
    def _mode(request: web.Request) -> str | None:
        """The CloudEvents content mode of the request's headers, None for none."""
        raw = request.headers.get("content-type", "")
        if raw in (STRUCTURED, BATCH):  # what the webhook sink sends: taken as is
            return raw
        content_type = raw.split(";")[0].strip().lower()
        if content_type in (BATCH, STRUCTURED):
            return content_type
        if "ce-specversion" in request.headers:
            return BINARY
        return None

    @staticmethod
    def _bodies(request: web.Request, mode: str, body: bytes) -> list[bytes]:
        """The structured JSON of each event in the request; `ContractError` if unreadable."""
        if mode == BATCH:
            return bounds.split_batch(body)
        if mode == STRUCTURED:
            return [body]
        return [contract.binary_to_structured(request.headers, body)]

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        ingestor = self._ingestor
        if ingestor is None:
            return _bad(503, "the fleet service is starting or stopping")
        try:
            ingestor.group.admit()  # at most `[fleet.ingest] max_requests` at once
        except Overloaded as exc:
            return self._overloaded(ingestor, exc)
        try:
            return await self._handle(request, ingestor)
        finally:
            ingestor.group.leave()

    def _overloaded(self, ingestor: Ingestor, exc: Overloaded) -> web.Response:
        """503 with Retry-After: back-pressure (the webhook sink keeps the events and honours
        it). A body that is not in yet is never read: aiohttp then closes the connection."""
        ingestor.stats.overloaded[self.name] += 1
        return web.json_response(
            {"error": str(exc)}, status=503, headers={"Retry-After": str(exc.retry_after)}
        )

    async def _handle(self, request: web.Request, ingestor: Ingestor) -> web.Response:
        wait = self._guard.limiter.retry_after(request.remote)
        if wait is not None:
            return too_many(wait)
        limit = self._config.max_body
        length = request.content_length
        if length is not None and length > limit:
            ingestor.stats.refused(self.name)
            return _too_large(limit)
        mode = self._mode(request)
        try:
            signed = self._credential(request, mode or STRUCTURED)
        except Refusal as refusal:
            return self._refuse(request, refusal)
        if mode is None:
            ingestor.stats.refused(self.name)
            content_type = request.headers.get("content-type", "none")
            return _closing(
                _bad(
                    415,
                    f"content type {content_type} is not a CloudEvents structured, batch or "
                    "binary mode",
                )
            )
        hold = _Hold(self._budget)
        try:
            if length is not None and not hold.take(length):
                return _busy()
            body = await self._read(request, signed, hold, length is None)
            if isinstance(body, web.Response):
                if body.status == 413:
                    ingestor.stats.refused(self.name)
                return body
            request[BODY] = body  # for the refusal's log line (bridge/fleet/ingest_log.py)
            try:
                bodies = self._bodies(request, mode, body)
            except contract.ContractError as exc:
                return await self._commit(ingestor, [], [(0, Refused(body, str(exc)))])
            accepted, refused = classify(bodies)
            # instance identity (bridge/fleet/identity/): 401/403, the refused kept in `rejected`
            credential = request.headers.get(CREDENTIAL_HEADER)
            gated = screen(self.identity, credential, accepted, refused)
            return await self._commit(
                ingestor, gated.accepted, gated.refused, gated.status, gated.attested
            )
        finally:
            hold.release()

    async def _read(
        self,
        request: web.Request,
        signed: signing.Verification | None,
        hold: _Hold,
        count_chunks: bool,
    ) -> bytes | web.Response:
        """The body, read as it streams in: each chunk goes into the signature's HMACs and,
        without a Content-Length (`count_chunks`), into the bytes in flight; the refusal
        when it is too large, too slow, over the cap or not signed by a configured secret."""
        limit, timeout = self._config.max_body, self._config.body_timeout
        content = request.content
        if content.is_eof():  # all of it came with the headers (a small post): no wait
            body = content.read_nowait()
            if len(body) > limit:
                return _too_large(limit)
            if count_chunks and not hold.take(len(body)):
                return _busy()
            return self._verified(request, signed, body)
        chunks: list[bytes] = []
        size = 0

        def take(chunk: bytes) -> web.Response | None:
            nonlocal size
            size += len(chunk)
            if size > limit:
                return _too_large(limit)
            if count_chunks and not hold.take(len(chunk)):
                return _busy()
            if signed is not None:
                signed.update(chunk)
            chunks.append(chunk)
            return None

        try:
            async with asyncio.timeout(timeout):
                async for chunk in content.iter_chunked(CHUNK):
                    refusal = take(chunk)
                    if refusal is not None:
                        return refusal
        except TimeoutError:
            log.warning("POST %s from %s: body not in after %ss", PATH, request.remote, timeout)
            return _closing(_bad(408, f"the body did not arrive within {timeout} s"))
        return self._verified(request, signed, b"".join(chunks), fed=True)

    def _verified(
        self,
        request: web.Request,
        signed: signing.Verification | None,
        body: bytes,
        fed: bool = False,
    ) -> bytes | web.Response:
        """`body` when its signature verifies (or none is needed), else the refusal; `fed`:
        the body went into the signature's HMACs as it streamed in."""
        if signed is None:
            return body
        if not fed:
            signed.update(body)
        if not signed.verified():
            return self._refuse(
                request, Refusal("no signature matches a configured secret", "signature")
            )
        return body

    async def _commit(
        self,
        ingestor: Ingestor,
        accepted: list[Accepted],
        refused: list[tuple[int, Refused]],
        status: int = 400,
        attested: bool | None = None,
    ) -> web.Response:
        try:
            result = await ingestor.commit(
                self.name, accepted, [r for _, r in refused], grouped=True, attested=attested
            )
        except Overloaded as exc:
            return self._overloaded(ingestor, exc)
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
        if result.invalid:  # events the store itself refused (`Ingestor`): in the rejected table
            why = f"refused: {result.invalid} event(s) the fleet store cannot keep"
            return _bad(400, f"{why}; see /v1/fleet/rejected", **counts)
        return web.Response(body=_JSON.encode(counts), content_type="application/json")


def _closing(response: web.Response) -> web.Response:
    """An answer after which the connection closes: the rest of the body is never read."""
    response.force_close()
    return response


def _too_large(limit: int) -> web.Response:
    """413, from Content-Length before the body is read or as it streams: never read on."""
    return _closing(_bad(413, f"body larger than {limit} bytes"))


def _busy() -> web.Response:
    """max_in_flight is reached: the sender retries later (the webhook sink honours it)."""
    response = web.json_response(
        {"error": "too many request bodies in flight; retry"},
        status=503,
        headers={"Retry-After": "1"},
    )
    return _closing(response)
