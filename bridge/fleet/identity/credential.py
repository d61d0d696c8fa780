"""The credential the fleet issues at enrollment: a short JWT (HS256, PyJWT) naming the
attested instance, so each event costs one HMAC check, not one cloud verification.

HS256 keeps it small (about 400 bytes: it travels in a bus attribute, 1,024 bytes at most on
Pub/Sub) and needs no key distribution: only the fleet signs and checks. The key is a
configured secret (`[fleet.identity] credential_key`), so every replica of the fleet and a
restarted one accept what another issued.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from .model import AttestationError, Attested

ISSUER: Final = "maintenance-bridge-fleet"
#: A credential longer than this is refused unread (and never issued).
MAX_LENGTH: Final = 1024
MIN_KEY_BYTES: Final = 32
#: Credentials remembered as verified (one per enrolled sidecar is enough; oldest dropped).
CACHED: Final = 20_000


@dataclass(frozen=True)
class Issued:
    token: str
    expires_at: float
    attested: Attested
    #: Issued for a valid credential (`method = "renew"`), not for a document.
    renewed: bool = False


class Credentials:
    """Issues and checks credentials with one key."""

    def __init__(
        self, key: bytes, audience: str, ttl: float, clock: Callable[[], float] = time.time
    ) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"the credential key needs at least {MIN_KEY_BYTES} bytes")
        self._key = key
        self._audience = audience
        self.ttl = ttl
        self._clock = clock
        #: token -> (its expiry, its instance): a sidecar sends the same credential with
        #: every post, so its signature is checked once, not per request.
        self._verified: dict[str, tuple[float, Attested]] = {}

    def __repr__(self) -> str:
        return f"Credentials(audience={self._audience!r}, ttl={self.ttl})"

    def issue(self, attested: Attested, now: float | None = None) -> Issued:
        import jwt

        now = self._clock() if now is None else now
        expires = now + self.ttl
        claims = {
            "iss": ISSUER,
            "aud": self._audience,
            "iat": int(now),
            "exp": int(expires),
            "jti": secrets.token_urlsafe(9),
            "ins": attested.as_dict(),
        }
        token = jwt.encode(claims, self._key, algorithm="HS256")
        if len(token) > MAX_LENGTH:
            raise AttestationError(f"the instance's names make a credential over {MAX_LENGTH} B")
        # Signed here, so known good: the sidecar's first post skips the decode (PyJWT's
        # checks cost about 0.5 ms a token, a third of a small post's whole handling).
        self._remember(token, float(int(expires)), attested)
        return Issued(token, float(int(expires)), attested)

    def check(self, token: str, at: float | None = None) -> Attested:
        """The instance a credential names; `AttestationError` (401) if it does not verify.
        `at`: when the message carrying it was sent, if a bus vouches for that time (the
        credential must have been valid then, not now: a message may wait on a bus); never
        later than now."""
        import jwt

        if not token or len(token) > MAX_LENGTH:
            raise AttestationError("credential missing or too long")
        when = self._clock() if at is None else min(at, self._clock())
        known = self._verified.get(token)
        if known is not None:
            if when < known[0]:
                return known[1]
            if at is None:
                del self._verified[token]
            raise AttestationError("credential expired: enroll again")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self._key,
                algorithms=["HS256"],
                audience=self._audience,
                issuer=ISSUER,
                # the expiry is checked below, against the same clock as the cache
                options={"require": ["exp", "iat", "iss", "aud"], "verify_exp": False},
            )
        except jwt.PyJWTError as exc:
            raise AttestationError(f"credential invalid: {exc}") from exc
        expires = claims["exp"]
        if not isinstance(expires, int | float) or expires <= when:
            raise AttestationError("credential expired: enroll again")
        instance = claims.get("ins")
        if not isinstance(instance, dict):
            raise AttestationError("credential names no instance")
        try:
            attested = Attested.from_dict(instance)
        except TypeError as exc:
            raise AttestationError("credential names no instance") from exc
        self._remember(token, float(expires), attested)
        return attested

    def _remember(self, token: str, expires: float, attested: Attested) -> None:
        if len(self._verified) >= CACHED:
            del self._verified[next(iter(self._verified))]
        self._verified[token] = (expires, attested)
