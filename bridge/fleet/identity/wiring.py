"""The fleet service's identity part, built from `[fleet.identity]`: the enroller behind
`POST /v1/enroll` and the gate of each source."""

from __future__ import annotations

import logging
import time
from typing import Final

from aiohttp import web

from bridge.fleet.metrics import IngestStats
from bridge.fleet.store import Store, StoreError

from .config import IdentityConfig, IdentityMode
from .enrollment import MAX_REQUEST, Enroller
from .gate import IdentityGate
from .ledger import StoreLedger
from .model import AttestationError

log = logging.getLogger("bridge.fleet.identity")
ENROLL_PATH: Final = "/v1/enroll"
STATUS_PATH: Final = "/v1/fleet/identity"


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
        """`GET /v1/fleet/identity`: per instance, its enrollment (from the store) and
        whether its last event carried a credential (this process's view): what a fleet
        migrating with `identity = "optional"` watches."""
        try:
            enrolled = await self.ledger.enrolled()
        except StoreError as exc:
            log.error("identity status: %s", exc)
            return web.json_response({"error": "the fleet store cannot answer now"}, status=503)
        seen: dict[str, tuple[bool, float]] = {}
        for gate in self.gates.values():
            for source, (attested, at) in gate.last_seen.items():
                if source not in seen or at > seen[source][1]:
                    seen[source] = (attested, at)
        instances = [
            {
                "source": source,
                "enrollment": enrolled.get(source),
                "last_event_attested": seen[source][0] if source in seen else None,
            }
            for source in sorted(set(enrolled) | set(seen))
        ]
        return web.json_response({"count": len(instances), "instances": instances})

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
