"""The configuration of who may read and who may write: the `[fleet.auth]` table.

```toml
[fleet.auth]
public_read = false          # reads without a credential off loopback: only when true
open_metrics = false         # /metrics without a credential off loopback
session_lifetime = 43200     # seconds a sign-in to the page lasts
failures_per_hour = 720      # failed credentials from one address before 429 (0: off)
proxy_header = "X-Forwarded-User"     # a trusted proxy's signed-in user (optional)
trusted_proxies = ["127.0.0.1/32"]    # the only addresses whose proxy_header counts

[[fleet.auth.credentials]]
name = "grafana"
scopes = ["read"]
token = "env:FLEET_READ_TOKEN"
```

Scopes (Grafana's access policies and FleetDM's Observer role are the anchors): `ingest`
posts events to `POST /v1/events`; `read` reads the API, the page, the audit log and the
rejected inputs; `eligible` reads `/v1/fleet/eligible` only (what an election recipe on every
VM needs). A credential may hold several. The http source's own `token` and `secrets` keep
meaning `ingest`. Plain Structs: the checks live in `bridge.fleet.auth`.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Final, Literal

import msgspec

from bridge.infra.secrets import Secret
from bridge.infra.validation import FieldError

Scope = Literal["ingest", "read", "eligible"]
SCOPES: Final[tuple[Scope, ...]] = ("ingest", "read", "eligible")
#: Characters a credential's name may hold (it is written into the session cookie and logs).
_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
#: Tokens shorter than this are guessable; `openssl rand -hex 32` makes 64 characters.
MIN_TOKEN_LENGTH: Final = 16


class Credential(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """One `[[fleet.auth.credentials]]` entry: a bearer token and what it grants."""

    name: str
    scopes: tuple[Scope, ...]
    token: Secret

    def __post_init__(self) -> None:
        if not self.name or not set(self.name) <= _NAME_CHARS or len(self.name) > 64:
            raise FieldError("name", "1-64 characters of letters, digits, '-', '_', '.'")
        if not self.scopes:
            raise FieldError("scopes", f"name at least one of {', '.join(SCOPES)}")
        check_token("token", self.token, MIN_TOKEN_LENGTH)


def check_token(key: str, token: Secret, min_length: int = 1) -> None:
    """An empty or short token is a configuration error, never a credential anyone holds.

    The http source's `token` keeps its old rules (any non-empty value, so existing
    configurations still load); new credentials need `MIN_TOKEN_LENGTH`."""
    value = token.get_secret_value()
    if not value.strip():
        raise FieldError(key, "is empty (an empty token would let anyone in)")
    if len(value) < min_length:
        raise FieldError(key, f"is shorter than {min_length} characters")
    if any(ord(c) < 0x21 or ord(c) > 0x7E for c in value):
        raise FieldError(key, "holds characters an HTTP header cannot carry (printable ASCII)")


class FleetAuth(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """`[fleet.auth]` (see the module docstring)."""

    credentials: tuple[Credential, ...] = ()
    public_read: bool = False
    open_metrics: bool = False
    #: Seconds a page sign-in lasts (then the page asks again).
    session_lifetime: Annotated[float, msgspec.Meta(ge=60, le=30 * 86400)] = 12 * 3600.0
    #: Failed credentials one address may present in an hour before it is answered 429.
    failures_per_hour: Annotated[int, msgspec.Meta(ge=0)] = 720
    proxy_header: str | None = None
    trusted_proxies: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = [c.name for c in self.credentials]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise FieldError("credentials", f"the name {twice[0]!r} is used twice")
        tokens = [c.token for c in self.credentials]
        if len(set(tokens)) != len(tokens):
            raise FieldError("credentials", "two credentials share a token; give each its own")
        for entry in self.trusted_proxies:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise FieldError("trusted_proxies", f"{entry!r} is no address or network") from None
        if self.proxy_header is not None:
            if not self.proxy_header.strip() or ":" in self.proxy_header:
                raise FieldError("proxy_header", "must be an HTTP header name")
            if not self.trusted_proxies:
                raise FieldError(
                    "trusted_proxies",
                    "proxy_header is honoured only from trusted_proxies: list the proxy's address",
                )
        if self.public_read and self.protects_reads:
            raise FieldError(
                "public_read", "is true but read credentials are configured: choose one"
            )

    def with_scope(self, scope: Scope) -> tuple[Credential, ...]:
        return tuple(c for c in self.credentials if scope in c.scopes)

    @property
    def protects_reads(self) -> bool:
        """Reads need a credential once any read or eligible credential, or a proxy, exists."""
        return (
            bool(self.with_scope("read"))
            or bool(self.with_scope("eligible"))
            or self.proxy_header is not None
        )
