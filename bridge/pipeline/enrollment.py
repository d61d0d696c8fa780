"""The sidecar's side of instance identity: attest once to the fleet, then hold a credential
of its own.

With an `[identity]` table the sidecar, once its watcher has identified the VM, fetches its
cloud's signed identity document (`bridge.providers.<cloud>.identity`), posts it to the
fleet's `POST /v1/enroll` and keeps the credential it gets back. The webhook sink sends that
credential with every post (header `Maintenance-Bridge-Credential`). It is renewed before it
expires (at 80 % of its life) with itself (`method = "renew"`: no document needed, which
matters on AWS, whose document the fleet takes only once); an expired or refused credential
is dropped and the VM attests again. Until a credential is held the sink waits (a `Retry`),
so no event is sent unattested to a fleet that requires identity, and none is lost.

```toml
[identity]
enroll_url = "https://fleet.example.com/v1/enroll"
audience = "https://fleet.example.com"   # what the fleet's [fleet.identity] audience says
```
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from bridge.infra.credential import AttestationUnavailable, EnrollmentPending, IdentitySettings
from bridge.providerapi import registry

if TYPE_CHECKING:
    from bridge.config import Config
    from bridge.pipeline.model import Instance

log = logging.getLogger("bridge.identity")
#: The share of a credential's life after which it is renewed.
RENEW_AT: Final = 0.8


Attest = Callable[[str], Awaitable[dict[str, str]]]


class Enrollment:
    """The credential of this VM (see the module docstring); one per sidecar."""

    def __init__(
        self,
        settings: IdentitySettings,
        config: Config | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._config = config
        self._clock = clock
        self._attest: Attest | None = None
        self._source: str | None = None
        self._token: str | None = None
        self._renew_at = 0.0
        self._expires_at = 0.0
        self._lock = asyncio.Lock()
        self.enrollments = 0
        self.problem: str | None = "the VM is not identified yet"

    def __repr__(self) -> str:
        return (
            f"Enrollment(enroll_url={self.settings.enroll_url!r}, held={self._token is not None})"
        )

    def identified(self, provider: str, instance: Instance, attest: Attest | None = None) -> None:
        """The watcher named the VM: attest with `provider`'s document from now on."""
        if attest is None:
            name = registry.named(provider)
            try:
                attestation: Any = None if name is None else registry.load(name, "identity")
            except ModuleNotFoundError:
                attestation = None
            if not callable(attestation):
                self.problem = f"{provider} has no identity document this bridge can read"
                log.error("[identity]: %s; nothing is sent to the fleet", self.problem)
                return
            config = self._config

            async def attest(audience: str) -> dict[str, str]:
                result: dict[str, str] = await attestation(config, audience)
                return result

        self._attest = attest
        self._source = instance.source

    def invalidate(self) -> None:
        """The fleet refused the credential (401): attest again before the next post."""
        self._token = None

    async def credential(self) -> str:
        """A credential valid now, enrolling or renewing first when due; `EnrollmentPending`
        with the reason when there is none."""
        now = self._clock()
        if self._token is not None and now < self._renew_at:
            return self._token
        async with self._lock:
            now = self._clock()
            if self._token is not None and now < self._renew_at:
                return self._token
            await self._enroll(now)
            assert self._token is not None
            return self._token

    async def _enroll(self, now: float) -> None:
        if self._attest is None or self._source is None:
            raise EnrollmentPending(self.problem or "not enrolled")
        request: dict[str, str]
        if self._token is not None and now < self._expires_at:
            request = {"method": "renew", "document": self._token}
        else:
            try:
                request = await self._attest(self.settings.audience)
            except AttestationUnavailable as exc:
                self.problem = str(exc)
                raise EnrollmentPending(self.problem) from exc
            except Exception as exc:  # a metadata error: transient, retried by the sink
                self.problem = f"cannot read the identity document: {exc}"
                raise EnrollmentPending(self.problem) from exc
        request["source"] = self._source
        answer = await self._post(request)
        if answer.get("credential") is None:
            self._token = None  # a refused renewal: attest again next time
            self.problem = f"enrollment refused: {answer.get('error', answer)}"
            log.error("%s", self.problem)
            raise EnrollmentPending(self.problem)
        self._token = str(answer["credential"])
        self._expires_at = float(answer["expires_at"])
        self._renew_at = now + (self._expires_at - now) * RENEW_AT
        self.enrollments += 1
        self.problem = None
        log.info(
            "enrolled with the fleet (%s), credential until %.0f",
            request["method"],
            self._expires_at,
        )

    async def _post(self, request: dict[str, str]) -> dict[str, Any]:
        from bridge.infra import tls
        from bridge.infra.http1 import Http1Client, TransportError

        url = self.settings.enroll_url
        context = (
            ssl.create_default_context(cafile=tls.default_cas())
            if url.startswith("https:")
            else None
        )
        client = Http1Client(
            url,
            timeout=self.settings.timeout,
            user_agent="maintenance-bridge",
            ssl_context=context,
            max_body=64 * 1024,
        )
        try:
            response = await client.request(
                "POST",
                body=json.dumps(request).encode(),
                headers={"content-type": "application/json"},
            )
        except TransportError as exc:
            self.problem = f"cannot reach {url}: {exc}"
            raise EnrollmentPending(self.problem) from exc
        finally:
            await client.aclose()
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            answer = {"error": f"HTTP {response.status}"}
        return answer
