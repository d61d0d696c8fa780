"""POSTs events to an HTTP endpoint the way the CloudEvents webhook spec and Standard Webhooks
describe it, so that a receiver can trust what it gets.

Content modes (CloudEvents HTTP binding): `structured` (default; one JSON CloudEvent per
request), `binary` (`ce-` headers, percent-encoded by the SDK's binding exactly as the spec
says, data as the body) and `batch` (`application/cloudevents-batch+json`, up to
`BATCH_SIZE` events per request, only when configured because many receivers do not speak it).

HTTP semantics: 2xx is delivery; redirects are never followed (a 3xx is rejected with the
location in the reason: the url must be fixed, not silently changed); 408/425/429 and 5xx
and network failures are transient, Retry-After honored; 413 and 415 (and the other 4xx)
are permanent; 410 disables the sink (see `WebhookSink`). The sink only classifies: the
dispatcher retries, and a retry re-signs the same bytes with the same `webhook-id` and a
fresh `webhook-timestamp` (receivers reject stale timestamps, so re-sending an old signature
would be refused after five minutes of outage).

One HTTP/1.1 client per sink (`bridge.infra.http1`, h11 over asyncio streams, chosen for its
per-request cost: it is what bounds a backlog drain): keep-alive and connection reuse, TLS
verification always on (custom CA bundle optional; a client certificate for mutual TLS
optional, both re-read when their files change, see `bridge.infra.tls`), and nothing read
from the process environment (HTTP_PROXY, SSL_CERT_FILE, .netrc), so nothing outside this
sink's own keys can redirect or weaken it; a proxy is used only when this sink's `proxy` key
says so.

Credentials (signing secrets, bearer token, header values) stay in a `Secret` until the
moment a request is built; they are never logged, never in a reason and never in a repr.
"""

from __future__ import annotations

import collections
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Final, Literal
from urllib.parse import urlsplit

import msgspec
from cloudevents.core.v1.event import CloudEvent

from bridge.infra import tls
from bridge.infra.backoff import parse_retry_after
from bridge.infra.buildinfo import user_agent
from bridge.infra.credential import HEADER as CREDENTIAL_HEADER
from bridge.infra.http1 import Http1Client, RequestTimeoutError, Response, TransportError
from bridge.sinkapi import (
    CredentialSource,
    Encoded,
    FieldError,
    Health,
    HttpUrl,
    Ok,
    Reject,
    Result,
    Retry,
    Secret,
    Sink,
    SinkConfig,
    instance_credential,
    json_format,
    parse,
    serialize,
)
from bridge.transports import webhook_signing as signing

log = logging.getLogger("sinks.webhook")

STRUCTURED_CONTENT_TYPE: Final = "application/cloudevents+json; charset=utf-8"
BATCH_CONTENT_TYPE: Final = "application/cloudevents-batch+json; charset=utf-8"
#: Bytes of a receiver's answer kept (only its status and headers matter to the sink).
RESPONSE_BODY_KEPT: Final = 64 * 1024
#: Events per request in `batch` mode.
BATCH_SIZE: Final = 100
#: How long a disabled sink (410 Gone) asks the dispatcher to wait between (refused) tries.
DISABLED_RETRY_AFTER: Final = 3600.0
#: How long to wait before asking again after a receiver refused the handshake.
HANDSHAKE_DENIED_RETRY_AFTER: Final = 300.0

_TRANSIENT_STATUS: Final = frozenset({408, 425, 429})
_HEALTH_FAILURES: Final = frozenset({401, 403, 407, 410})
_HEADER_NAME: Final = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# Headers the sink sets itself: letting `headers` override them would break the binding,
# the signature or the handshake in ways a receiver could not tell from an attack.
_RESERVED_HEADERS: Final = frozenset(
    {
        "host",
        "content-type",
        "content-length",
        "transfer-encoding",
        "connection",
        "origin",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "webhook-request-origin",
        signing.GITHUB_HEADER.lower(),
    }
)

Mode = Literal["structured", "binary", "batch"]
Signing = Literal["none", "standard", "github"]


class Config(SinkConfig, frozen=True, kw_only=True):
    """The `[[sinks]] type = "webhook"` keys (documented in docs/webhook.md)."""

    type: Literal["webhook"] = "webhook"
    url: HttpUrl
    mode: Mode = "structured"
    signing: Signing = "none"
    secrets: tuple[Secret, ...] = ()
    bearer_token: Secret | None = None
    headers: dict[str, Secret] = msgspec.field(default_factory=dict)
    timeout: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    ca_bundle: Path | None = None
    client_cert: str | None = None
    client_key: str | None = None
    proxy: HttpUrl | None = None
    handshake_origin: str | None = None

    def __post_init__(self) -> None:
        self._check_headers()
        self._check_ca_bundle()
        self._check_client_certificate()
        self._check_origin()
        self._check_signing()

    def _check_headers(self) -> None:
        for name, secret in self.headers.items():
            if not _HEADER_NAME.match(name):
                raise FieldError("headers", f"{name!r} is not a valid HTTP header name")
            lowered = name.lower()
            if lowered in _RESERVED_HEADERS or lowered.startswith("ce-"):
                raise FieldError(
                    "headers", f"header {name!r} is set by the sink itself and cannot be set"
                )
            if any(c in secret.get_secret_value() for c in "\r\n\0"):
                raise FieldError("headers", f"the value of header {name!r} contains a line break")

    def _check_ca_bundle(self) -> None:
        if self.ca_bundle is None:
            return
        if not self.ca_bundle.is_file():
            raise FieldError("ca_bundle", f"{self.ca_bundle} does not exist or is not a file")
        try:
            tls.validate(tls.TlsFiles(ca=tls.Pem(self.ca_bundle)), tls.client_context, "ca_bundle")
        except tls.CertificateError as exc:
            raise FieldError("ca_bundle", str(exc)) from None

    def tls_files(self) -> tls.TlsFiles | None:
        """The certificate files of the connection (None: the public CAs, no client
        certificate); `client_cert` and `client_key` take a path, `file:PATH` or `env:VAR`."""
        if self.client_cert is None and self.client_key is None:
            ca = tls.Pem(self.ca_bundle) if self.ca_bundle is not None else None
            return tls.TlsFiles(ca=ca) if ca is not None else None
        if self.client_cert is None or self.client_key is None:
            missing = "client_key" if self.client_key is None else "client_cert"
            raise FieldError(missing, "required")  # with the other of the pair
        pems = []
        for key, value in (("client_cert", self.client_cert), ("client_key", self.client_key)):
            try:
                pems.append(tls.Pem.parse(value))
            except ValueError as exc:
                raise FieldError(key, str(exc)) from None
        ca = tls.Pem(self.ca_bundle) if self.ca_bundle is not None else None
        return tls.TlsFiles(pems[0], pems[1], ca)

    def _check_client_certificate(self) -> None:
        files = self.tls_files()
        if files is None or files.cert is None:
            return
        try:
            tls.validate(files, tls.client_context, "webhook sink client certificate")
        except tls.CertificateError as exc:
            raise FieldError("client_cert", str(exc)) from None

    def _check_origin(self) -> None:
        value = self.handshake_origin
        if value is not None and (not value or any(c.isspace() for c in value)):
            raise FieldError(
                "handshake_origin", "must be a non-empty DNS name such as bridge.example.com"
            )

    def _check_signing(self) -> None:
        if self.signing == "none" and self.secrets:
            raise ValueError(
                'secrets are set but signing = "none": set signing = "standard" or "github"'
            )
        if self.signing != "none" and not self.secrets:
            raise ValueError(f'signing = "{self.signing}" needs at least one entry in secrets')
        if self.signing == "standard":
            for index, secret in enumerate(self.secrets):
                try:
                    signing.standard_key(secret.get_secret_value())
                except ValueError as exc:
                    raise ValueError(f"secrets[{index}] {exc}") from None
        if self.bearer_token is not None and any(
            name.lower() == "authorization" for name in self.headers
        ):
            raise ValueError("set either bearer_token or an Authorization header, not both")


def redact_url(url: str) -> str:
    """The url without user info and query, which may carry credentials: for logs/reasons."""
    parsed = urlsplit(url)
    host = parsed.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{host}{port}{parsed.path}"


def classify_status(response: Response, url: str) -> Result:
    """Map an HTTP answer from `url` (already redacted) to a delivery outcome.

    410 is classified here as permanent; `WebhookSink` handles it before calling this,
    because for a webhook it means "this endpoint is gone", not "this event is bad".
    """
    status = response.status
    if 200 <= status < 300:
        return Ok()
    reason = f"HTTP {status} from {url}"
    if status in _TRANSIENT_STATUS or status >= 500:
        return Retry(reason, parse_retry_after(response.headers.get("retry-after")))
    if 300 <= status < 400:
        location = (
            redact_url(response.headers["location"]) if "location" in response.headers else "?"
        )
        return Reject(f"{reason}: redirect to {location} not followed; fix the sink's url")
    if status == 413:
        return Reject(f"{reason}: the receiver refuses a request this large")
    if status == 415:
        return Reject(f"{reason}: the receiver does not accept this content mode; check `mode`")
    return Reject(reason)


class WebhookSink(Sink):
    """One webhook endpoint; one event per request (structured or binary mode).

    410 Gone disables the sink, loudly, without losing anything. The CloudEvents webhook
    spec says a sender must stop sending to a target that answered 410. Returning `Reject`
    would dead-letter the event and then do the same to every later one, one request each,
    turning a retired or mistyped endpoint into a pile of dead letters that someone must
    replay. Instead the sink remembers it is disabled and from then on sends nothing: each
    `publish` returns `Retry(after=DISABLED_RETRY_AFTER)` and logs at ERROR, so the events
    stay spooled for this sink (oldest first, as always), the error repeats in the log every
    hour, and `healthcheck` reports the sink unhealthy. Fixing the url and restarting the
    bridge delivers the backlog; removing the sink from the configuration drops it.
    """

    max_batch = 1
    #: The sidecar's credential (`[identity]`), set by the runner; None: none is sent.
    enrollment: CredentialSource | None = None

    def __init__(self, name: str, config: Config) -> None:
        super().__init__(name)
        self._url = str(config.url)
        self.display_url = redact_url(self._url)
        self.mode: Mode = config.mode
        self._signing: Signing = config.signing
        self._secrets = config.secrets
        self._bearer = config.bearer_token
        self._headers = dict(config.headers)
        self._origin = config.handshake_origin
        self._granted = False
        self._allowed_rate: int | None = None
        self._recent: collections.deque[float] = collections.deque()
        self._disabled: str | None = None
        files = config.tls_files()
        #: The connection's certificate files (CA bundle, client certificate), re-read when
        #: they change; None with neither (certifi's public CAs).
        self.tls = (
            tls.ReloadingContext(files, tls.client_context, f"sink {name}")
            if files is not None
            else None
        )
        self._client = Http1Client(
            self._url,
            timeout=config.timeout,
            user_agent=user_agent(),
            ssl_context=self.tls.current if self.tls is not None else None,
            proxy=str(config.proxy) if config.proxy is not None else None,
            max_body=RESPONSE_BODY_KEPT,
        )

    @property
    def disabled(self) -> str | None:
        """Why the sink stopped sending (410 Gone), or None while it is enabled."""
        return self._disabled

    # -- encoding and signing -------------------------------------------------------------------

    def _encode(self, batch: Sequence[CloudEvent]) -> tuple[bytes, dict[str, str]]:
        """The body and binding headers of one request, serialized exactly once."""
        if self.mode == "binary":
            (event,) = batch
            # Imported here: the SDK's HTTP binding pulls in its date parser and time zone
            # database (about 2 MiB resident), which structured and batch mode never use.
            from cloudevents.core.bindings.http import to_binary

            message = to_binary(event, json_format())
            headers = dict(message.headers)
            headers.setdefault("content-type", "application/json")
            return message.body, headers
        return self._splice([serialize(event) for event in batch])

    def _splice(self, bodies: Sequence[bytes]) -> tuple[bytes, dict[str, str]]:
        """The body and binding header of a structured or batch request from structured-mode
        JSON events: one event as it is, a batch as the JSON array of them."""
        if self.mode == "batch":
            return b"[" + b",".join(bodies) + b"]", {"content-type": BATCH_CONTENT_TYPE}
        (body,) = bodies
        return body, {"content-type": STRUCTURED_CONTENT_TYPE}

    def _signature(
        self, ids: Sequence[str], body: bytes, headers: Mapping[str, str]
    ) -> dict[str, str]:
        """The signature headers of a request whose other headers are `headers`; in binary
        mode the Standard Webhooks signatures cover the `ce-*` attributes too."""
        if self._signing == "standard":
            keys = [signing.standard_key(s.get_secret_value()) for s in self._secrets]
            msg_id = signing.webhook_id(ids)
            attributes = (
                signing.attributes_block(headers.items()) if self.mode == "binary" else None
            )
            return signing.standard_headers(msg_id, int(time.time()), body, keys, attributes)
        if self._signing == "github":
            return signing.github_headers(body, self._secrets[0].get_secret_value().encode())
        return {}

    def _auth_headers(self) -> dict[str, str]:
        headers = {name: value.get_secret_value() for name, value in self._headers.items()}
        if self._bearer is not None:
            headers["authorization"] = f"Bearer {self._bearer.get_secret_value()}"
        return headers

    # -- abuse protection -----------------------------------------------------------------------

    async def _ensure_permission(self) -> Retry | None:
        """Run the CloudEvents abuse-protection handshake unless a grant is remembered.

        The grant is kept until a delivery fails (any non-2xx answer or network error); the
        next attempt then asks again, so a receiver that withdrew consent or changed its
        allowed rate is heard. A refusal keeps the events spooled (Retry), it never drops them.
        """
        if self._origin is None or self._granted:
            return None
        headers = {**self._auth_headers(), "webhook-request-origin": self._origin}
        try:
            response = await self._client.request("OPTIONS", headers=headers)
        except RequestTimeoutError as exc:
            return Retry(f"handshake with {self.display_url}: timeout: {exc}")
        except TransportError as exc:
            return Retry(f"handshake: cannot reach {self.display_url}: {exc}")
        status = response.status
        if status == 410:
            return self._disable(status)
        allowed = response.headers.get("webhook-allowed-origin", "").strip()
        rate_text = response.headers.get("webhook-allowed-rate", "*").strip()
        rate = (
            int(rate_text)
            if rate_text.isascii() and rate_text.isdigit() and int(rate_text) > 0
            else None
        )
        rate_ok = rate_text == "*" or rate is not None
        if 200 <= status < 300 and allowed in (self._origin, "*") and rate_ok:
            self._granted = True
            self._allowed_rate = rate
            log.info(
                "sink %s: %s granted delivery to origin %s (rate: %s per minute)",
                self.name,
                self.display_url,
                self._origin,
                rate or "unlimited",
            )
            return None
        if status in _TRANSIENT_STATUS or status >= 500:
            return Retry(
                f"handshake: HTTP {status} from {self.display_url}",
                parse_retry_after(response.headers.get("retry-after")),
            )
        reason = (
            f"{self.display_url} did not grant delivery to origin {self._origin!r} in the "
            f"abuse-protection handshake (HTTP {status}, WebHook-Allowed-Origin: "
            f"{allowed or 'absent'}, WebHook-Allowed-Rate: {rate_text}); events stay spooled"
        )
        log.error("sink %s: %s", self.name, reason)
        return Retry(reason, HANDSHAKE_DENIED_RETRY_AFTER)

    def _throttle(self) -> Retry | None:
        """Keep to the rate the receiver allowed, by asking the dispatcher to wait."""
        if self._allowed_rate is None:
            return None
        now = time.monotonic()
        while self._recent and now - self._recent[0] >= 60.0:
            self._recent.popleft()
        if len(self._recent) < self._allowed_rate:
            self._recent.append(now)
            return None
        wait = 60.0 - (now - self._recent[0])
        return Retry(f"{self.display_url} allows {self._allowed_rate} request(s) per minute", wait)

    # -- delivery -------------------------------------------------------------------------------

    def _disable(self, status: int) -> Retry:
        self._disabled = (
            f"HTTP {status} Gone from {self.display_url}: the receiver retired this endpoint. "
            f"Sink {self.name!r} is DISABLED and sends nothing more; its events stay spooled. "
            "Fix the url (or remove the sink) and restart the bridge"
        )
        log.error("sink %s: %s", self.name, self._disabled)
        return Retry(self._disabled, DISABLED_RETRY_AFTER)

    async def _credential(self) -> dict[str, str] | Retry:
        """The instance credential header when `[identity]` is configured; a `Retry` while
        the sidecar is not enrolled (its events wait in the spool, none goes unattested)."""
        credential = await instance_credential(self.enrollment)
        if credential is None or isinstance(credential, Retry):
            return {} if credential is None else credential
        return {CREDENTIAL_HEADER: credential}

    async def _publish(self, batch: Sequence[CloudEvent]) -> Result:
        return await self._post(lambda: self._encode(batch), [event.get_id() for event in batch])

    async def _publish_encoded(self, batch: Sequence[Encoded]) -> Result:
        """Structured and batch requests carry the spooled bytes as they are (the same bytes
        `_encode` would write, without parsing them back); binary mode needs the attributes."""
        if self.mode == "binary":
            return await self._publish([parse(item.body) for item in batch])
        bodies = [item.body for item in batch]
        return await self._post(lambda: self._splice(bodies), [item.id for item in batch])

    async def _post(
        self, encode: Callable[[], tuple[bytes, dict[str, str]]], ids: Sequence[str]
    ) -> Result:
        """One delivery attempt of the events `ids`, whose body and binding headers `encode`
        builds (only once the sink is enabled and allowed to send)."""
        if self._disabled is not None:
            log.error("sink %s: %s", self.name, self._disabled)
            return Retry(self._disabled, DISABLED_RETRY_AFTER)
        refused = await self._ensure_permission() or self._throttle()
        if refused is not None:
            return refused
        identity = await self._credential()  # instance identity (bridge/pipeline/enrollment.py)
        if isinstance(identity, Retry):
            return identity
        body, binding = encode()
        headers = {**self._auth_headers(), **binding, **identity}
        headers.update(self._signature(ids, body, headers))
        if self._origin is not None:
            headers["origin"] = self._origin
        result: Result
        try:
            response = await self._client.request("POST", headers=headers, body=body)
        except RequestTimeoutError as exc:
            result = Retry(f"timeout posting to {self.display_url}: {exc}")
        except TransportError as exc:
            result = Retry(f"cannot reach {self.display_url}: {exc}{self._certificate_note()}")
        else:
            if response.status == 410:
                result = self._disable(410)
            elif response.status == 401 and self.enrollment is not None and identity:
                self.enrollment.invalidate()  # expired or revoked: attest again, then resend
                result = Retry(f"HTTP 401 from {self.display_url}: credential refused")
            else:
                result = classify_status(response, self.display_url)
        if not isinstance(result, Ok):
            self._granted = False
        return result

    def client_certificate(self) -> tls.ReloadingContext | None:
        return self.tls if self.tls is not None and self.tls.certificate is not None else None

    def certificate_problem(self) -> str | None:
        """What is wrong with the client certificate in use (expired, not yet valid, renewed
        files that cannot be loaded), or None; for the health check and `doctor`."""
        if self.tls is None or self.tls.certificate is None:
            return None
        problem = self.tls.problem()
        return f"client {problem}" if problem is not None else None

    def _certificate_note(self) -> str:
        """Said after a connection failure when the sink presents a client certificate: a
        receiver that refuses it often just closes the connection, so the reason names it."""
        if self.tls is None or self.tls.certificate is None:
            return ""
        problem = self.certificate_problem()
        if problem is not None:
            return f"; our {problem}"
        return f"; client certificate presented: {self.tls.certificate.describe()}"

    async def healthcheck(self) -> Health:
        """Disabled, a bad client certificate, refused by the handshake, unreachable or
        401/403 are unhealthy."""
        if self._disabled is not None:
            return Health(False, self._disabled)
        problem = self.certificate_problem()
        if problem is not None:
            return Health(False, problem)
        if self._origin is not None:
            self._granted = False
            refused = await self._ensure_permission()
            if refused is not None:
                return Health(False, refused.reason)
            return Health(True, f"{self.display_url} granted delivery to {self._origin}")
        try:
            response = await self._client.request("OPTIONS", headers=self._auth_headers())
        except TransportError as exc:
            return Health(
                False, f"cannot reach {self.display_url}: {exc}{self._certificate_note()}"
            )
        ok = response.status not in _HEALTH_FAILURES
        return Health(ok, f"{self.display_url} answered HTTP {response.status}")

    async def _close(self, timeout: float) -> None:
        await self._client.aclose()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self.mode} {self.display_url}>"


class BatchWebhookSink(WebhookSink):
    """`mode = "batch"`: up to `BATCH_SIZE` events per `application/cloudevents-batch+json`.

    A 413 for a batch is a Reject, which makes the dispatcher retry the events one by one,
    so a receiver with a small body limit still gets every event that fits.
    """

    max_batch = BATCH_SIZE


def create(config: Config, name: str) -> WebhookSink:
    if config.mode == "batch":
        return BatchWebhookSink(name, config)
    return WebhookSink(name, config)
