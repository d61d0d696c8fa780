"""The fleet service's configuration: the `[fleet]` tables of a TOML file.

```toml
[fleet.listener]          # the API, POST /v1/events, /metrics, /healthz, /readyz
host = "127.0.0.1"
port = 8470
# tls_cert = "/etc/maintenance-bridge/fleet.pem"    # HTTPS (with tls_key), and mutual TLS
# tls_key = "/etc/maintenance-bridge/fleet.key"     # with client_ca
[fleet.store]
url = "sqlite:///var/lib/maintenance-bridge/fleet.sqlite3"
[fleet.retention]         # how long the store keeps what: bridge/fleet/retention.py
events_days = 400
[[fleet.sources]]
type = "http"
secrets = ["env:FLEET_WEBHOOK_SECRET"]
[[fleet.auth.credentials]] # who may read: see bridge/fleet/auth_config.py
name = "grafana"
scopes = ["read"]
token = "env:FLEET_READ_TOKEN"
```

Validated like the sidecar's configuration (`bridge.infra.validation`: every mistake named by its
key path, secrets as literal, `env:VAR` or `file:PATH`), and overridable from the
environment the same way (`MAINTENANCE_BRIDGE__FLEET__LISTENER__PORT=9000`). Other top-level
tables are ignored, so one file may configure a sidecar and a fleet service.

Sources are an array of tables told apart by `type`; `SOURCE_TYPES` maps each type to its
config Struct (a new source adds its entry there and its class in `bridge.fleet.sources`;
its SDK is imported only when the service builds it).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

import msgspec

from bridge.config import apply_env_overrides, read_toml
from bridge.fleet.auth_config import FleetAuth, check_token
from bridge.fleet.bus_config import EventHubsSourceConfig, PubsubSourceConfig
from bridge.fleet.identity.config import IdentityConfig, IdentityMode
from bridge.fleet.kafka_config import KafkaSourceConfig
from bridge.fleet.retention import FleetRetention
from bridge.infra import tls
from bridge.infra.secrets import Secret
from bridge.infra.tracing import TracingSettings
from bridge.infra.validation import ConfigError, FieldError, render_path, validate_into
from bridge.transports import webhook_signing as signing

ENV_PREFIX: Final = "MAINTENANCE_BRIDGE__FLEET__"
DEFAULT_PORT: Final = 8470
DEFAULT_STORE_URL: Final = "sqlite:///var/lib/maintenance-bridge/fleet.sqlite3"
#: Bytes of one POST /v1/events body, at most (the webhook sink's batch of 100 is ~250 KiB).
DEFAULT_MAX_BODY: Final = 4 * 1024 * 1024
#: Body bytes of POST /v1/events held at once across all requests (16 largest bodies).
DEFAULT_MAX_IN_FLIGHT: Final = 64 * 1024 * 1024


class _Table(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """A table of the file: unknown keys are errors and the values never change."""


class FleetListener(_Table, frozen=True, kw_only=True):
    """Where the service listens; with `tls_cert` and `tls_key` it speaks HTTPS only, and
    with `client_ca` too, only to clients whose certificate chains to that CA (mutual TLS).
    The three take a path, `file:PATH` or `env:VAR`; the files are re-read when they change
    (`bridge.infra.tls`), so a renewed certificate needs no restart."""

    host: str = "127.0.0.1"  # loopback unless other machines must reach it
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = DEFAULT_PORT  # 0 picks a free port
    tls_cert: str | None = None
    tls_key: str | None = None
    client_ca: str | None = None

    def __post_init__(self) -> None:
        files = self.tls_files()
        if files is not None:
            try:
                tls.validate(files, tls.server_context, "[fleet.listener]")
            except tls.CertificateError as exc:
                raise FieldError("tls_cert", str(exc)) from None

    def tls_files(self) -> tls.TlsFiles | None:
        """The listener's certificate files, or None for plain HTTP."""
        if self.tls_cert is None and self.tls_key is None:
            if self.client_ca is not None:
                raise FieldError("client_ca", "needs tls_cert and tls_key (mutual TLS is TLS)")
            return None
        if self.tls_cert is None or self.tls_key is None:
            missing = "tls_key" if self.tls_key is None else "tls_cert"
            raise FieldError(missing, "required")  # with the other of the pair
        pems = []
        for key, value in (("tls_cert", self.tls_cert), ("tls_key", self.tls_key)):
            try:
                pems.append(tls.Pem.parse(value))
            except ValueError as exc:
                raise FieldError(key, str(exc)) from None
        try:
            ca = tls.Pem.parse(self.client_ca) if self.client_ca is not None else None
        except ValueError as exc:
            raise FieldError("client_ca", str(exc)) from None
        return tls.TlsFiles(pems[0], pems[1], ca)

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


class FleetStore(_Table, frozen=True, kw_only=True):
    url: str = DEFAULT_STORE_URL

    def __post_init__(self) -> None:
        scheme = urlsplit(self.url).scheme
        if scheme not in ("sqlite", "postgresql", "postgres"):
            raise FieldError("url", "must be sqlite:///PATH or postgresql://...")
        if scheme == "sqlite" and not self.sqlite_path().name:
            raise FieldError("url", "sqlite:///PATH needs a file path")

    def sqlite_path(self) -> Path:
        """The file of `sqlite://` + path: `sqlite:///var/lib/x.sqlite3` is /var/lib/x.sqlite3,
        `sqlite://fleet.sqlite3` is relative to the working directory."""
        return Path(self.url.removeprefix("sqlite://"))


class HttpSourceConfig(_Table, frozen=True, kw_only=True):
    """`type = "http"`: POST /v1/events on the fleet listener (see bridge/fleet/sources/http.py).

    Standard Webhooks secrets (`secrets`, several during a rotation; `secret` for one) or a
    bearer `token` (an `ingest` credential, as are `[[fleet.auth.credentials]]` with that
    scope), or none of them: then only a loopback listener may take unsigned posts.
    `binary_unsigned_attributes` takes binary-mode posts whose signature covers the body but
    not the `ce-*` attributes (sidecars before the attributes were signed): off by default.
    """

    type: Literal["http"] = "http"
    name: str = "http"
    secret: Secret | None = None
    secrets: tuple[Secret, ...] = ()
    token: Secret | None = None
    max_body: Annotated[int, msgspec.Meta(ge=1024)] = DEFAULT_MAX_BODY
    max_in_flight: Annotated[int, msgspec.Meta(ge=1024)] = DEFAULT_MAX_IN_FLIGHT
    #: Seconds the whole body of a POST may take to arrive (nginx: 60 s between reads).
    body_timeout: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 60.0
    binary_unsigned_attributes: bool = False
    #: Seconds a webhook-timestamp may differ from now (Standard Webhooks: 5 minutes).
    tolerance: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    #: Instance identity (`[fleet.identity]`, bridge/fleet/identity/): events only from
    #: enrolled sidecars about their own VM ("required"), or marked when they are ("optional").
    identity: IdentityMode = "off"

    def __post_init__(self) -> None:
        if self.token is not None:
            check_token("token", self.token)
        if self.max_in_flight < self.max_body:
            raise FieldError("max_in_flight", "must be at least max_body")
        for index, secret in enumerate(self.all_secrets()):
            try:
                signing.standard_key(secret.get_secret_value())
            except ValueError as exc:
                raise FieldError("secrets", f"[{index}] {exc}") from None

    def all_secrets(self) -> tuple[Secret, ...]:
        return ((self.secret,) if self.secret is not None else ()) + self.secrets

    @property
    def authenticated(self) -> bool:
        return bool(self.all_secrets()) or self.token is not None


#: Source type -> its configuration Struct.
SOURCE_TYPES: Final[dict[str, type[msgspec.Struct]]] = {
    "http": HttpSourceConfig,
    "pubsub": PubsubSourceConfig,
    "eventhubs": EventHubsSourceConfig,
    "kafka": KafkaSourceConfig,
}


class FleetApi(_Table, frozen=True, kw_only=True):
    #: Seconds; maintenance sooner than this makes an instance not eligible (as the sidecar).
    eligible_horizon: Annotated[float, msgspec.Meta(ge=0)] = 3600.0
    #: Rows per page of /v1/fleet/events (also its default) and of every other list, at most
    #: (their default is `bridge.fleet.paging.DEFAULT_PAGE_SIZE`, 100).
    page_size: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 500


class FleetIngest(_Table, frozen=True, kw_only=True):
    """`[fleet.ingest]`: group commit of the http source's posts (`bridge.fleet.group_commit`).

    Events of concurrent posts share one transaction of at most `group_events` events,
    waiting at most `group_wait` seconds for company when the store is idle; at most
    `max_queued` events wait for the store, and at most `max_requests` posts are handled at
    once: past either, a post is 503 with Retry-After.
    """

    group_events: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 500
    group_wait: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.002
    max_queued: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 20_000
    max_requests: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 256


class FleetTracing(TracingSettings, frozen=True, kw_only=True):
    """`[fleet.tracing]`: the sidecar's `[tracing]` keys, under the service's own name."""

    service_name: str = "maintenance-fleet"


class FleetConfig(_Table, frozen=True, kw_only=True):
    listener: FleetListener = FleetListener()
    store: FleetStore = FleetStore()
    api: FleetApi = FleetApi()
    ingest: FleetIngest = FleetIngest()
    auth: FleetAuth = FleetAuth()
    identity: IdentityConfig | None = None
    retention: FleetRetention = FleetRetention()
    tracing: FleetTracing | None = None
    sources: tuple[Any, ...] = ()

    def source_names(self) -> list[str]:
        return [str(source.name) for source in self.sources]


def parse_fleet_config(raw: Mapping[str, Any], origin: str = "configuration") -> FleetConfig:
    """Validate the `[fleet]` table of a parsed document; `ConfigError` lists every problem."""
    table = raw.get("fleet", {})
    problems: list[str] = []
    if not isinstance(table, Mapping):
        raise ConfigError(["fleet: must be a table"], origin)
    data = dict(table)
    sources_raw = data.pop("sources", [{"type": "http"}])
    config = validate_into(problems, FleetConfig, data, ("fleet",))
    sources: list[Any] = []
    if not isinstance(sources_raw, list):
        problems.append("fleet.sources: must be an array of tables ([[fleet.sources]])")
        sources_raw = []
    for index, entry in enumerate(sources_raw):
        at = ("fleet", "sources", index)
        kind = entry.get("type") if isinstance(entry, dict) else None
        model = SOURCE_TYPES.get(kind) if isinstance(kind, str) else None
        if model is None:
            known = ", ".join(sorted(SOURCE_TYPES))
            problems.append(f"{render_path(at)}.type: required, one of {known}")
            continue
        source = validate_into(problems, model, entry, at)
        if source is not None:
            sources.append(source)
    names = [str(getattr(s, "name", "")) for s in sources]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"fleet.sources: the name {name!r} is used twice; give each a name")
    if config is not None:
        problems += _exposure_problems(config, sources)
        for index, source in enumerate(sources):
            if getattr(source, "identity", "off") != "off" and config.identity is None:
                problems.append(
                    f"fleet.sources[{index}].identity: needs a [fleet.identity] table "
                    "(its trust material and credential key)"
                )
    if problems or config is None:
        raise ConfigError(problems, origin)
    return msgspec.structs.replace(config, sources=tuple(sources))


def _exposure_problems(config: FleetConfig, sources: list[Any]) -> list[str]:
    """What a listener off loopback must not leave open: unsigned ingest, and reads without
    a credential unless `public_read = true` says so in words."""
    problems = []
    if not config.listener.loopback and not (config.auth.protects_reads or config.auth.public_read):
        problems.append(
            f"fleet.auth: reads (the API, the page, the audit log) would be open to anyone "
            f"reaching {config.listener.host}: add [[fleet.auth.credentials]] with the read "
            "scope, a proxy_header, or set public_read = true"
        )
    ingest_credentials = bool(config.auth.with_scope("ingest"))
    for index, source in enumerate(sources):
        if (
            isinstance(source, HttpSourceConfig)
            and not source.authenticated
            and not ingest_credentials
            and not config.listener.loopback
        ):
            problems.append(
                f"fleet.sources[{index}]: an http source without secrets or token only "
                f"takes unsigned events on a loopback listener, not on {config.listener.host}"
            )
    return problems


def load_fleet_config(path: Path | None, environ: Mapping[str, str] = os.environ) -> FleetConfig:
    """Read `path` (or nothing: the defaults), apply environment overrides, validate."""
    raw = read_toml(path)
    origin = str(path) if path is not None else "configuration"
    fleet_env = {k: v for k, v in environ.items() if k.startswith(ENV_PREFIX)}
    return parse_fleet_config(apply_env_overrides(raw, fleet_env), origin)
