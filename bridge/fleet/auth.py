"""Who may read and who may write on the fleet listener (docs/security.md is the user's view).

- Credentials (`[[fleet.auth.credentials]]`, plus each http source's own `token` as an
  `ingest` credential) are kept as SHA-256 digests, never as the token: a presented bearer
  token is hashed and compared with every digest in constant time (`hmac.compare_digest`).
- Reads (`/v1/fleet/*`, the page, the audit log, the rejected inputs) need `read`, or
  `eligible` for `/v1/fleet/eligible`, once any read or eligible credential or a trusted
  proxy is configured; `/healthz`, `/readyz`, the static files and the sign-in stay open;
  `/metrics` is open on a loopback listener or with `open_metrics`. With no such credential
  reads are open, which the configuration allows off loopback only with `public_read`.
- The API takes `Authorization: Bearer <token>`. The page takes a sign-in cookie: HttpOnly,
  SameSite=Strict, Secure on a TLS listener, bounded lifetime, its value `name.expiry.mac`
  where the MAC is an HMAC-SHA256 keyed by a key derived from the credential's token, so
  every replica holding the same configuration accepts it and rotating the token ends its
  sessions. Or a header set by a trusted proxy, honoured only from `trusted_proxies`.
- Failed credentials are counted per client address; past `failures_per_hour` in the last
  hour the address is answered 429 with Retry-After (FleetDM's 720 an hour is the default).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import logging
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import quote

from aiohttp import web

from bridge.fleet.auth_config import Credential, FleetAuth, Scope
from bridge.fleet.metrics import AuthStats
from bridge.infra.secrets import Secret

log = logging.getLogger("bridge.fleet.auth")

COOKIE: Final = "fleet_session"
SIGN_IN: Final = "/signin"
SIGN_OUT: Final = "/signout"
#: Paths anyone reaching the port may use: health, the page's assets, the sign-in itself and
#: the API's description (it holds no data).
OPEN_PATHS: Final = frozenset({"/healthz", "/readyz", SIGN_IN, SIGN_OUT, "/v1/openapi.json"})
OPEN_PREFIXES: Final = ("/static/",)
#: POST /v1/events checks its own credentials (the http source: signatures or a token).
INGEST_PATH: Final = "/v1/events"
#: Client addresses whose failures are remembered at once, at most (a bound on memory).
MAX_TRACKED: Final = 65_536
WINDOW: Final = 3600.0
_SESSION_CONTEXT: Final = b"maintenance-bridge fleet session v1"
_BEARER: Final = re.compile(r"Bearer ([!-~]{1,4096})", re.IGNORECASE)
_EXPIRY: Final = re.compile(r"[0-9]{1,12}")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Refusal(Exception):
    """A credential that is malformed or unknown; the message says which (never the value)."""

    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.kind = kind  # the metric's reason label


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


@dataclass(frozen=True)
class Holder:
    """A credential as the service keeps it: its name, scopes and digests, not the token."""

    name: str
    scopes: frozenset[Scope]
    token_digest: bytes = field(repr=False)
    session_key: bytes = field(repr=False)

    @classmethod
    def of(cls, name: str, scopes: Iterable[Scope], token: Secret) -> Holder:
        value = token.get_secret_value().encode("utf-8", "surrogateescape")
        return cls(
            name,
            frozenset(scopes),
            hashlib.sha256(value).digest(),
            hmac.new(value, _SESSION_CONTEXT, hashlib.sha256).digest(),
        )


class TokenBook:
    """Every credential the service accepts, looked up by a presented token in constant time."""

    def __init__(self, holders: Iterable[Holder]) -> None:
        self.holders = tuple(holders)

    @classmethod
    def of(
        cls, credentials: Iterable[Credential], ingest_tokens: Iterable[tuple[str, Secret]]
    ) -> TokenBook:
        """The configured credentials, and each http source's `token` as `ingest`."""
        holders = [Holder.of(c.name, c.scopes, c.token) for c in credentials]
        holders += [Holder.of(name, ("ingest",), token) for name, token in ingest_tokens]
        return cls(holders)

    def __repr__(self) -> str:
        return f"TokenBook({[h.name for h in self.holders]})"

    def has(self, scope: Scope) -> bool:
        return any(scope in h.scopes for h in self.holders)

    def find(self, token: str) -> Holder | None:
        """The holder of `token`; every digest is compared, so the time tells nothing."""
        presented = digest(token)
        found = None
        for holder in self.holders:
            if hmac.compare_digest(presented, holder.token_digest):
                found = holder
        return found

    def named(self, name: str) -> Holder | None:
        return next((h for h in self.holders if h.name == name), None)


def bearer(request: web.BaseRequest) -> str | None:
    """The token of the request's `Authorization: Bearer`, None without the header;
    `Refusal` when the header is there but is no bearer token of printable ASCII."""
    values = request.headers.getall("Authorization", [])
    if not values:
        return None
    if len(values) > 1:
        raise Refusal("more than one Authorization header", "malformed")
    match = _BEARER.fullmatch(values[0].strip())
    if match is None:
        raise Refusal("malformed Authorization header: expected Bearer <token>", "malformed")
    return match.group(1)


class FailureLimiter:
    """Failed credentials per client address over the last hour; past `per_hour`, 429.

    Behind a proxy or a NAT every client shares one address: docs/security.md says so."""

    def __init__(
        self, per_hour: int, stats: AuthStats, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_hour = per_hour
        self.stats = stats  # the fleet_auth_* metrics
        self._clock = clock
        self._seen: dict[str, deque[float]] = {}

    def retry_after(self, address: str | None) -> int | None:
        """Seconds until `address` may try again, or None when it may now."""
        if not self.per_hour:
            return None
        times = self._seen.get(address or "")
        if times is None:
            return None
        now = self._clock()
        while times and times[0] <= now - WINDOW:
            times.popleft()
        if len(times) < self.per_hour:
            return None
        self.stats.throttled += 1
        return max(1, int(times[0] + WINDOW - now) + 1)

    def failed(self, address: str | None, kind: str) -> None:
        self.stats.failures[kind] += 1
        if not self.per_hour:
            return
        key = address or ""
        times = self._seen.pop(key, None) or deque(maxlen=self.per_hour)
        times.append(self._clock())
        self._seen[key] = times  # re-inserted: the dict's order is least recently failed first
        while len(self._seen) > MAX_TRACKED:
            del self._seen[next(iter(self._seen))]


def too_many(seconds: int) -> web.Response:
    response = web.json_response(
        {"error": "too many failed credentials from this address; retry later"},
        status=429,
        headers={"Retry-After": str(seconds)},
    )
    response.force_close()  # no body of a throttled client is read
    return response


def unauthorized(reason: str) -> web.Response:
    response = web.json_response(
        {"error": reason}, status=401, headers={"WWW-Authenticate": 'Bearer realm="fleet"'}
    )
    response.force_close()  # the rest of the body is never read
    return response


class Sessions:
    """The page's sign-in cookie (see the module docstring)."""

    def __init__(self, book: TokenBook, lifetime: float) -> None:
        self.book = book
        self.lifetime = lifetime

    @staticmethod
    def _mac(holder: Holder, payload: str) -> str:
        mac = hmac.new(holder.session_key, payload.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).decode("ascii").rstrip("=")

    def issue(self, holder: Holder, now: float) -> str:
        payload = f"{holder.name}.{int(now + self.lifetime)}"
        return f"{payload}.{self._mac(holder, payload)}"

    def holder(self, value: str, now: float) -> Holder | None:
        """The holder of a valid, unexpired cookie value, else None."""
        parts = value.rsplit(".", 2)
        if len(parts) != 3 or not _EXPIRY.fullmatch(parts[1]):
            return None
        name, expiry, mac = parts
        holder = self.book.named(name)
        if holder is None or not now < int(expiry) <= now + self.lifetime:
            return None
        expected = self._mac(holder, f"{name}.{expiry}").encode()
        if not hmac.compare_digest(expected, mac.encode("utf-8", "surrogateescape")):
            return None
        return holder


@dataclass(frozen=True)
class Grant:
    """Who a request is (a credential's name, or `proxy:<user>`) and what they may do."""

    who: str
    scopes: frozenset[Scope]


class AccessGuard:
    """The listener's middleware for reads, and the credentials the http sources share."""

    def __init__(
        self,
        auth: FleetAuth,
        loopback: bool,
        ingest_tokens: Iterable[tuple[str, Secret]] = (),
        stats: AuthStats | None = None,
    ) -> None:
        self.settings = auth
        self.loopback = loopback
        self.book = TokenBook.of(auth.credentials, ingest_tokens)
        self.sessions = Sessions(self.book, auth.session_lifetime)
        self.limiter = FailureLimiter(auth.failures_per_hour, stats or AuthStats())
        self._proxies = [ipaddress.ip_network(p, strict=False) for p in auth.trusted_proxies]

    def __repr__(self) -> str:
        return f"AccessGuard({self.book!r}, protects_reads={self.settings.protects_reads})"

    def needs(self, request: web.Request) -> Scope | None:
        """The scope a request needs, None when it is open."""
        path = request.path
        if path == INGEST_PATH or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            return None
        if not self.settings.protects_reads:
            return None
        if path == "/metrics" and (self.loopback or self.settings.open_metrics):
            return None
        return "eligible" if path == "/v1/fleet/eligible" else "read"

    def _from_proxy(self, request: web.Request) -> Grant | None:
        name = self.settings.proxy_header
        if name is None or request.remote is None:
            return None
        user = request.headers.get(name, "").strip()
        if not user:
            return None
        try:
            address = ipaddress.ip_address(request.remote)
        except ValueError:
            return None
        if not any(address in network for network in self._proxies):
            return None  # anyone may send the header: only the proxy's counts
        return Grant(f"proxy:{user[:64]}", frozenset({"read", "eligible"}))

    def grant(self, request: web.Request) -> Grant | None:
        """The request's credential; None without one; `Refusal` for a bad one."""
        token = bearer(request)
        if token is not None:
            holder = self.book.find(token)
            if holder is None:
                raise Refusal("unknown bearer token", "unknown")
            return Grant(holder.name, holder.scopes)
        cookie = request.cookies.get(COOKIE)
        if cookie:
            holder = self.sessions.holder(cookie, time.time())
            if holder is not None and "read" in holder.scopes:
                return Grant(holder.name, holder.scopes)
        return self._from_proxy(request)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        need = self.needs(request)
        if need is None:
            return await handler(request)
        wait = self.limiter.retry_after(request.remote)
        if wait is not None:
            return too_many(wait)
        try:
            grant = self.grant(request)
        except Refusal as exc:
            self.limiter.failed(request.remote, exc.kind)
            log.warning(
                "%s %s from %s refused: %s", request.method, request.path, request.remote, exc
            )
            return unauthorized(str(exc))
        if grant is None:
            if _is_page(request):
                target = quote(request.path_qs, safe="/?=&")
                raise web.HTTPSeeOther(f"{SIGN_IN}?next={target}")
            return unauthorized(f"this needs a credential with the {need} scope (Bearer token)")
        if need in grant.scopes or (need == "eligible" and "read" in grant.scopes):
            return await handler(request)
        return web.json_response(
            {"error": f"the credential {grant.who!r} does not grant {need}"}, status=403
        )


def _is_page(request: web.Request) -> bool:
    """A browser's navigation to the page (sent to the sign-in) rather than an API call."""
    path = request.path
    return request.method == "GET" and (path == "/" or path.startswith("/instances/"))
