"""The fleet service's identity part, built from `[fleet.identity]`: the enroller behind
`POST /v1/enroll` and the gate of each source."""

from __future__ import annotations

import logging
import time
from typing import Final

from aiohttp import web

from bridge.fleet.metrics import IngestStats
from bridge.fleet.store import InstanceQuery, Store, StoreError

from .config import IdentityConfig, IdentityMode
from .enrollment import MAX_REQUEST, Enroller
from .gate import IdentityGate
from .ledger import StoreLedger
from .model import AttestationError

log = logging.getLogger("bridge.fleet.identity")
ENROLL_PATH: Final = "/v1/enroll"
STATUS_PATH: Final = "/v1/fleet/identity"
#: Instances read per store query while `GET /v1/fleet/identity` gathers them.
STATUS_PAGE: Final = 1000


class FleetIdentity:
    def __init__(self, config: IdentityConfig, store: Store, stats: IngestStats) -> None:
        self.credentials = config.credentials()
        self.ledger = StoreLedger(store)
        self.enroller = Enroller(
            config.trust_files(), config.policy(), self.credentials, self.ledger
        )
        self.gates: dict[str, IdentityGate] = {}
        self.stats = stats

    def gate(self, source: str, mode: IdentityMode) -> IdentityGate:
        """The gate of source `source` (kept for /metrics)."""
        gate = self.gates[source] = IdentityGate(
            mode, self.credentials, source, self.stats.identity
        )
        return gate

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post(ENROLL_PATH, self.enroll)
        app.router.add_get(STATUS_PATH, self.status)

    async def status(self, _request: web.Request) -> web.Response:
        """`GET /v1/fleet/identity`: per instance, its enrollment and whether its latest
        stored events carried a credential (both from the store, so every replica answers
        the same): what a fleet migrating with `identity = "optional"` watches."""
        try:
            enrolled = await self.ledger.enrolled()
            seen = await self._checked()
        except StoreError as exc:
            log.error("identity status: %s", exc)
            return web.json_response({"error": "the fleet store cannot answer now"}, status=503)
        instances = [
            {
                "source": source,
                "enrollment": enrolled.get(source),
                "last_event_attested": seen.get(source),
            }
            for source in sorted(set(enrolled) | set(seen))
        ]
        return web.json_response({"count": len(instances), "instances": instances})

    async def _checked(self) -> dict[str, bool]:
        """Source -> whether its latest events were attested, of every instance whose
        events a source with identity checked (the store's `attestation`, page by page)."""
        found: dict[str, bool] = {}
        for wanted in ("attested", "unattested"):
            cursor: str | None = None
            while True:
                page = await self.ledger.store.instance_page(
                    InstanceQuery(attestation=wanted, cursor=cursor, limit=STATUS_PAGE)
                )
                found.update((row["source"], wanted == "attested") for row in page.rows)
                if page.next is None:
                    break
                cursor = page.next
        return found

    async def enroll(self, request: web.Request) -> web.Response:
        try:
            length = request.content_length
            if length is not None and length > MAX_REQUEST:
                raise AttestationError(f"enrollment request larger than {MAX_REQUEST} bytes", 413)
            try:
                body = await request.read()  # bounded by the application's client_max_size
            except web.HTTPRequestEntityTooLarge:
                raise AttestationError(
                    f"enrollment request larger than {MAX_REQUEST} bytes", 413
                ) from None
            issued = await self.enroller.enroll(body, time.time())
        except AttestationError as exc:
            self.stats.enrollments["refused"] += 1
            log.warning(
                "enrollment from %s refused (%d): %s", request.remote, exc.status, exc.reason
            )
            return web.json_response({"error": exc.reason}, status=exc.status)
        except StoreError as exc:
            log.error("enrollment: cannot record it: %s", exc)
            return web.json_response(
                {"error": "the fleet store cannot commit now; retry"},
                status=503,
                headers={"Retry-After": "5"},
            )
        self.stats.enrollments["renewed" if issued.renewed else "issued"] += 1
        attested = issued.attested
        log.info("enrolled %s (%s)", attested.source, attested.method)
        return web.json_response(
            {
                "credential": issued.token,
                "expires_at": issued.expires_at,
                "instance": attested.as_dict(),
            }
        )
