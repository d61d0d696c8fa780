"""The credential the fleet issues at enrollment: a short JWT (HS256, PyJWT) naming the
attested instance, so each event costs one HMAC check, not one cloud verification.

HS256 keeps it small (400 to 700 bytes: it travels in a bus attribute, 1,024 bytes at most
on Pub/Sub) and needs no key distribution: only the fleet signs and checks. The key is a
configured secret (`[fleet.identity] credential_key`), so every replica of the fleet and a
restarted one accept what another issued.

A sidecar sends the same credential with every post, so the fleet remembers the ones it
issued or verified, until they expire: a post then costs a digest and a look-up, not
PyJWT's checks (60 to 200 us here, HMAC and claims). It remembers `CACHED` of them, a fleet of
100,000 sidecars twice over (each may hold a renewed credential beside its last one), and
each in about 150 bytes (15 MiB at 100,000; `tests/identity/test_credential.py` measures
it): a digest of the token and its expiry, not the token (up to 1 KiB) nor its instance
(some 600 bytes of names). The instance is read again from the token's payload when it
comes, which is safe without the signature: a token with the digest of a verified one is
that token. That costs about 5 us a post, so the `RECENT` credentials last used are also
kept whole, with their instance (a sidecar draining its spool, or a bus backlog, sends one
credential many times in a row; 1.5 MiB at most).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from .model import AttestationError, Attested

ISSUER: Final = "maintenance-bridge-fleet"
#: A credential longer than this is refused unread (and never issued).
MAX_LENGTH: Final = 1024
MIN_KEY_BYTES: Final = 32
#: Credentials remembered as verified (the oldest dropped past it): see the module docstring.
CACHED: Final = 250_000
#: Credentials last used, kept with their instance (see the module docstring).
RECENT: Final = 1_024


class _Claims(msgspec.Struct):
    """What a remembered credential's payload is read for: the instance it names."""

    ins: Attested


_CLAIMS: Final = msgspec.json.Decoder(_Claims)


def _digest(token: str) -> bytes:
    """What a remembered credential is known by: SHA-256, 128 bits of it (a second token
    with the digest of a verified one is out of reach)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()[:16]


def _instance(token: str) -> Attested:
    """The instance named by `token`, a credential verified before (its digest says so):
    its payload, base64url without padding (RFC 7515), read again."""
    payload = token.split(".")[1]
    return _CLAIMS.decode(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))).ins


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
        #: `_digest(token)` -> its expiry: a sidecar sends the same credential with every
        #: post, so its signature is checked once, not per request (the module docstring).
        self._verified: dict[bytes, float] = {}
        #: token -> (its expiry, its instance), for the `RECENT` last used, oldest first.
        self._recent: OrderedDict[str, tuple[float, Attested]] = OrderedDict()

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
        if not token or len(token) > MAX_LENGTH:
            raise AttestationError("credential missing or too long")
        when = self._clock() if at is None else min(at, self._clock())
        recent = self._recent.get(token)
        if recent is not None and when < recent[0]:
            return recent[1]
        digest = _digest(token)
        expiry = self._verified.get(digest)
        if expiry is not None:
            if when >= expiry:
                if at is None:
                    del self._verified[digest]
                raise AttestationError("credential expired: enroll again")
            try:
                attested = _instance(token)
            except (msgspec.ValidationError, msgspec.DecodeError, ValueError):
                pass  # names of a shape the decoder does not take: PyJWT's way below
            else:
                self._keep(token, expiry, attested)
                return attested
        import jwt

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
        """`token` known good until `expires`: at most `CACHED` remembered, the oldest
        dropped past it (a sidecar that still sends one costs a PyJWT check, and it is
        remembered again)."""
        self._verified[_digest(token)] = expires
        if len(self._verified) > CACHED:
            # The oldest tenth dropped at once, the rest copied: a dict deleted from its
            # front one entry at a time makes each next look for its first entry longer.
            self._verified = dict(
                itertools.islice(
                    self._verified.items(), len(self._verified) - CACHED * 9 // 10, None
                )
            )
        self._keep(token, expires, attested)

    def _keep(self, token: str, expires: float, attested: Attested) -> None:
        """`token` among the `RECENT` last used, with its instance (the oldest dropped)."""
        self._recent[token] = (expires, attested)
        self._recent.move_to_end(token)
        if len(self._recent) > RECENT:
            self._recent.popitem(last=False)
