"""The one HTTP client for metadata services, with the vendors' safety rules built in.

Every request carries the vendor's header, never follows a redirect and never goes through a
proxy (`bridge.infra.http1` reads nothing from the environment: HTTP_PROXY must not see metadata
traffic, and a redirect or a proxy is exactly how a metadata request is hijacked). A
response without the vendor's response header is refused: the thing answering is not the
metadata service. Transient failures are retried forever with capped exponential backoff and
jitter (tenacity), because the metadata service is the only source of the notices: giving up
would mean missing one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypedDict, Unpack

from tenacity import RetryCallState

from bridge.infra.backoff import parse_retry_after, retry_logger, retry_until_done
from bridge.infra.buildinfo import user_agent
from bridge.infra.findings import METADATA_ADDRESS, Finding, dns_fix
from bridge.infra.http1 import (
    Http1Client,
    NameResolutionError,
    RequestTimeoutError,
    Response,
    TransportError,
)
from bridge.infra.prometheus import Histogram

log = logging.getLogger("bridge.metadata")

#: How a watcher waits (between retries, between polls); tests hand in one that does not.
Sleep = Callable[[float], Awaitable[None]]


async def real_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


#: The largest answer read from a metadata service; a longer one is refused, not cut short.
MAX_ANSWER = 1024 * 1024


class MetadataError(Exception):
    """The metadata service did not give a usable answer (always worth retrying)."""

    def __init__(
        self,
        message: str,
        status: int | None = None,
        retry_after: float | None = None,
        cause: str = "malformed",
    ):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        #: The counter it was counted under (`RequestStats.errors`).
        self.cause = cause


@dataclass
class RequestStats:
    """Counters a watcher exposes for metrics and health: errors by cause, last success."""

    requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    consecutive_failures: int = 0
    #: Events or fields of a document that could not be read and were left out (one bad
    #: event never holds back the rest of its document).
    skipped: int = 0
    #: Wall-clock time of the last usable answer (None until the first).
    last_success: float | None = None
    #: How long each request took, answered or not (long polls included).
    durations: Histogram = field(default_factory=Histogram)

    def failed(self, cause: str) -> None:
        self.errors[cause] = self.errors.get(cause, 0) + 1
        self.consecutive_failures += 1

    def succeeded(self) -> None:
        self.consecutive_failures = 0
        self.last_success = time.time()


def _retry_after_of_error(state: RetryCallState) -> float | None:
    outcome = state.outcome
    if outcome is not None and outcome.failed:
        exc = outcome.exception()
        if isinstance(exc, MetadataError):
            return exc.retry_after
    return None


class RequestOptions(TypedDict, total=False):
    """What `MetadataClient.request` passes on to each attempt (`request_once`'s keywords)."""

    params: Mapping[str, str] | None
    content: bytes | None
    timeout: float | None
    accept: Collection[int]
    headers: Mapping[str, str] | None
    fresh: bool


class MetadataClient:
    """GET/POST against one metadata base URL with the vendor's header rules."""

    def __init__(
        self,
        base_url: str,
        request_headers: Mapping[str, str],
        required_response_header: tuple[str, str] | None,
        *,
        timeout: float = 10.0,
        retry_initial: float = 0.5,
        retry_max: float = 30.0,
        sleep: Sleep = real_sleep,
        stats: RequestStats | None = None,
    ) -> None:
        self.base_url = base_url
        self._required = required_response_header
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        self._sleep = sleep
        #: Shared across the clients of one watcher's rebuilds, so counters never go back.
        self.stats = stats or RequestStats()
        self._client = Http1Client(
            base_url,
            timeout=timeout,
            user_agent=user_agent(),
            headers=request_headers,
            max_body=MAX_ANSWER,
        )

    @property
    def retry_initial(self) -> float:
        """First backoff delay (for callers that retry on their own, like AWS after a 401)."""
        return self._retry_initial

    @property
    def retry_max(self) -> float:
        return self._retry_max

    async def aclose(self) -> None:
        await self._client.aclose()

    async def request_once(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        content: bytes | None = None,
        timeout: float | None = None,
        accept: Collection[int] = (200,),
        headers: Mapping[str, str] | None = None,
        fresh: bool = False,
    ) -> Response:
        """One attempt; raises `MetadataError` unless the status is in `accept`.

        `headers` are added to the vendor's for this request only (AWS: the session token).
        `fresh`: on a new connection of its own (GCE's long polls, see `bridge.infra.http1`).
        """
        self.stats.requests += 1
        started = time.monotonic()
        try:
            response = await self._client.request(
                method,
                path,
                params=params,
                body=content or b"",
                timeout=timeout,
                headers=headers,
                fresh=fresh,
            )
        except RequestTimeoutError as exc:
            self.stats.durations.observe(time.monotonic() - started)
            self.stats.failed("timeout")
            raise MetadataError(f"{method} {path}: timed out ({exc})", cause="timeout") from exc
        except TransportError as exc:
            self.stats.durations.observe(time.monotonic() - started)
            self.stats.failed("connection")
            raise MetadataError(f"{method} {path}: {exc}", cause="connection") from exc
        self.stats.durations.observe(time.monotonic() - started)
        if response.truncated:
            self.stats.failed("malformed")
            raise MetadataError(
                f"{method} {path}: refused an answer longer than {MAX_ANSWER} bytes",
                response.status,
                cause="malformed",
            )
        if 300 <= response.status < 400:
            self.stats.failed("redirect")
            raise MetadataError(
                f"{method} {path}: refused redirect to {response.headers.get('location', '?')}",
                response.status,
                cause="redirect",
            )
        if self._required is not None:
            name, value = self._required
            if response.headers.get(name.lower()) != value:
                self.stats.failed("missing-vendor-header")
                raise MetadataError(
                    f"{method} {path}: refused a response without '{name}: {value}' "
                    f"(HTTP {response.status}); is something else answering?",
                    response.status,
                    cause="missing-vendor-header",
                )
        if response.status not in accept:
            self.stats.failed(str(response.status))
            raise MetadataError(
                f"{method} {path}: HTTP {response.status}: {response.text[:200]!r}",
                response.status,
                _retry_after(response),
                cause=str(response.status),
            )
        self.stats.succeeded()
        return response

    async def request(
        self,
        method: str,
        path: str,
        *,
        validate: Callable[[Response], object] | None = None,
        track: RequestStats | None = None,
        **options: Unpack[RequestOptions],
    ) -> Response:
        """Like `request_once`, retried until it succeeds (and `validate` does not raise).

        `track` counts this request's failures and success a second time, apart from the
        client's totals: the GCE watcher keeps one per key, so readiness can tell which key
        keeps failing while another succeeds.

        The retry loop is `bridge.infra.backoff.retry_until_done`, whose first attempt runs
        bare: building tenacity's retry state costs about 50 us, paid by every poll and by
        every long poll's answer on its way to the spool, while nearly every request
        succeeds. A failure enters the loop as attempt 1, with the server's Retry-After.
        """

        async def attempt() -> Response:
            try:
                response = await self._checked(method, path, validate, options)
            except MetadataError as exc:
                if track is not None:
                    track.failed(exc.cause)
                raise
            if track is not None:
                track.succeeded()
            return response

        return await retry_until_done(
            attempt,
            retry_on=MetadataError,
            initial=self._retry_initial,
            maximum=self._retry_max,
            before_sleep=_log_retry,
            sleep=self._sleep,
            retry_after=_retry_after_of_error,
        )

    async def _checked(
        self,
        method: str,
        path: str,
        validate: Callable[[Response], object] | None,
        options: RequestOptions,
    ) -> Response:
        """One attempt of `request`: `request_once`, then `validate` on its answer."""
        response = await self.request_once(method, path, **options)
        if validate is not None:
            try:
                validate(response)
            except (ValueError, KeyError, TypeError, RecursionError) as exc:
                # An accepted error status the validator refuses (a 503 that is not
                # upcoming-maintenance's "nothing scheduled") counts as that status.
                ok = response.status == 200
                cause = "malformed" if ok else str(response.status)
                self.stats.failed(cause)
                what = "malformed answer" if ok else f"HTTP {response.status}"
                raise MetadataError(
                    f"{method} {path}: {what}: {exc}",
                    response.status,
                    None if ok else _retry_after(response),
                    cause=cause,
                ) from exc
        return response

    async def get(self, path: str, **kwargs: Any) -> Response:
        return await self.request("GET", path, **kwargs)


def _retry_after(response: Response) -> float | None:
    return parse_retry_after(response.headers.get("retry-after"))


_log_retry: Final = retry_logger(
    log,
    "metadata request failed",
    level=logging.WARNING,
    quiet=logging.DEBUG,
    loud=(1, 5),
    every=50,
)


async def probe_once(
    what: str, url: str, path: str, headers: dict[str, str], timeout: float, **params: str
) -> tuple[Response | None, str]:
    """Detection's one GET (no redirect, no proxy, no retry): the answer, or None and why.

    `what` names the service in the reason ("GCE metadata server at <url>: ...").
    """
    client = Http1Client(url, timeout=timeout, user_agent=user_agent(), headers=headers)
    try:
        return await client.request("GET", path, params=params), ""
    except TransportError as exc:
        return None, f"{what} at {url}: {type(exc).__name__} {exc}".strip()
    finally:
        await client.aclose()


async def check_once(
    client: MetadataClient,
    path: str,
    params: Mapping[str, str] | None,
    header: str,
    extra_fix: str,
) -> Finding:
    """`doctor`'s metadata line: one plain request to the key the bridge watches.

    `header` says which vendor header the answer carried; `extra_fix` adds the provider's
    own hint to the fix of a failure. Closes `client`.
    """
    try:
        response = await client.request_once("GET", path, params=params)
    except MetadataError as exc:
        if isinstance(exc.__cause__, NameResolutionError):
            by_address = f", or set the metadata URL with its address ({METADATA_ADDRESS})"
            fix = dns_fix(exc.__cause__.host, by_address)
        else:
            fix = "check that nothing (a proxy, a firewall, a container network) sits between "
            fix += "this host and the metadata service" + extra_fix
        return Finding("metadata", "fail", f"{client.base_url}{path}: {exc}", fix)
    finally:
        await client.aclose()
    return Finding(
        "metadata",
        "ok",
        f"{client.base_url}{path}: HTTP {response.status}{header}, no redirect, no proxy",
    )
