"""EC2 instance metadata (IMDS) as the AWS watcher speaks it: paths, IMDSv2 session tokens,
and the parsers of the bodies it reads.

IMDSv2 is a session protocol: `PUT latest/api/token` with
`X-aws-ec2-metadata-token-ttl-seconds` returns a token that every later request carries as
`X-aws-ec2-metadata-token`. The PUT exists to stop the attacks IMDSv1 allowed: a PUT cannot
be forged through most SSRF holes, IMDS refuses a PUT that carries `X-Forwarded-For` (it came
through a proxy), and the answer to a PUT leaves with an IP TTL (the *hop limit*, 1 by
default) so it dies one hop away from the instance. That last rule is why a container behind
a bridge network needs a hop limit of 2, and why the classic symptom of a wrong hop limit is
a token PUT that times out while plain GETs would work.

The parsers raise `ValueError` on a body that is not what the vendor documents, so the
metadata client counts it as malformed and retries rather than announcing garbage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Literal

from bridge.infra.http1 import RequestTimeoutError, Response
from bridge.infra.timeparse import parse_optional_time, parse_time
from bridge.pipeline.watchers.base import load_json
from bridge.pipeline.watchers.http import MetadataClient, MetadataError

if TYPE_CHECKING:
    from bridge.providers.aws.settings import AwsSource

log = logging.getLogger("bridge.watchers.aws")

TOKEN_PATH: Final = "latest/api/token"  # noqa: S105 (a path, not a secret)
TTL_HEADER: Final = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER: Final = "X-aws-ec2-metadata-token"  # noqa: S105 (a header name)
IDENTITY_PATH: Final = "latest/dynamic/instance-identity/document"
SPOT_PATH: Final = "latest/meta-data/spot/instance-action"
REBALANCE_PATH: Final = "latest/meta-data/events/recommendations/rebalance"
SCHEDULED_PATH: Final = "latest/meta-data/events/maintenance/scheduled"
HISTORY_PATH: Final = "latest/meta-data/events/maintenance/history"
LIFECYCLE_PATH: Final = "latest/meta-data/autoscaling/target-lifecycle-state"

#: Token PUT failures after which `imds_v1_fallback` reads without a token: IMDS answers 403,
#: 404 or 405 where IMDSv2 is off or unsupported; None is a timeout (the hop limit symptom).
V1_FALLBACK_STATUSES: Final = (None, 403, 404, 405)
#: How long a fallback to IMDSv1 lasts before the PUT is tried again.
V1_RETRY_SECONDS: Final = 60.0


def parse_identity(body: bytes) -> dict[str, Any]:
    """The instance identity document; instanceId, region and accountId are required."""
    document = load_json(body)
    if not isinstance(document, dict):
        raise ValueError("the identity document is not a JSON object")
    for key in ("instanceId", "region", "accountId"):
        if not isinstance(document.get(key), str) or not document[key]:
            raise ValueError(f"{key} missing from the instance identity document")
    return document


def parse_instance_action(body: bytes) -> dict[str, Any]:
    """`{"action": "terminate|stop|hibernate", "time": RFC 3339}`."""
    document = load_json(body)
    if not isinstance(document, dict) or not isinstance(document.get("action"), str):
        raise ValueError("instance-action needs a string action")
    parse_time(document.get("time"))
    return document


def parse_rebalance(body: bytes) -> dict[str, Any]:
    """`{"noticeTime": RFC 3339}`."""
    document = load_json(body)
    if not isinstance(document, dict):
        raise ValueError("the rebalance recommendation is not a JSON object")
    parse_time(document.get("noticeTime"))
    return document


def parse_scheduled(body: bytes) -> list[dict[str, Any]]:
    """The scheduled (or history) events: a JSON array of objects with an EventId.

    An empty body is an empty list (IMDS has answered both `[]` and nothing at all).
    """
    if not body.strip():
        return []
    events = load_json(body)
    if not isinstance(events, list):
        raise ValueError("scheduled events are not a JSON array")
    for event in events:
        if not isinstance(event, dict) or not isinstance(event.get("EventId"), str):
            raise ValueError("every scheduled event needs a string EventId")
        if not isinstance(event.get("Code", ""), str) or not isinstance(event.get("State"), str):
            raise ValueError(f"event {event['EventId']}: Code and State must be strings")
        for key in ("NotBefore", "NotAfter", "NotBeforeDeadline"):
            parse_optional_time(event.get(key))  # raises ValueError when unparseable
    return events


def parse_lifecycle(body: bytes) -> str:
    """`InService`, `Terminated`, `Warmed:Running`, ...: one word of text."""
    try:
        text = body.decode("ascii").strip()
    except UnicodeDecodeError as exc:
        raise ValueError("the lifecycle state is not text") from exc
    if not text or any(c.isspace() for c in text) or len(text) > 64:
        raise ValueError(f"not a lifecycle state: {text[:64]!r}")
    return text


def arn_partition(region: str) -> str:
    """The ARN partition of a region (`aws`, `aws-cn`, `aws-us-gov`)."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def _token_of(response: Response) -> str:
    token = response.text.strip()
    if not token or any(c.isspace() for c in token):
        raise ValueError("the token PUT returned no token")
    return token


class TokenSession:
    """The IMDSv2 token: fetched on first use, renewed before it expires and after a 401.

    The token is renewed at 80% of its life (at most a minute early), measured from before
    the PUT left, so it is never used past its TTL even if the PUT was slow.
    """

    def __init__(
        self,
        client: MetadataClient,
        ttl: int,
        v1_fallback: bool,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._ttl = ttl
        self._v1_fallback = v1_fallback
        self._monotonic = monotonic
        self._token: str | None = None
        self._renew_at = 0.0
        #: Tokens obtained so far (renewals included): for metrics and tests.
        self.issued = 0
        #: True while reading without a token (only with `imds_v1_fallback`).
        self.using_v1 = False
        self._hinted = False  # the hop-limit hint is logged once

    def invalidate(self) -> None:
        """Forget the token (after a 401): the next request fetches a new one."""
        self._token = None
        self._renew_at = 0.0

    async def headers(self) -> dict[str, str]:
        """The headers proving the session: the token, or nothing in IMDSv1 fallback."""
        now = self._monotonic()
        if now < self._renew_at:
            return {TOKEN_HEADER: self._token} if self._token else {}
        await self._renew(now)
        return {TOKEN_HEADER: self._token} if self._token else {}

    async def _renew(self, started: float) -> None:
        """One PUT first (it decides the IMDSv1 fallback and names the hop limit), then,
        if it failed, the PUT retried with backoff until IMDS gives a token."""
        ttl_header = {TTL_HEADER: str(self._ttl)}
        outcome = await self._try_once(ttl_header, started)
        if outcome is True:
            return
        token = outcome or None
        if token is None:
            response = await self._client.request(
                "PUT", TOKEN_PATH, headers=ttl_header, validate=_token_of
            )
            token = _token_of(response)
        self._token = token
        self.using_v1 = False
        self.issued += 1
        self._renew_at = started + self._ttl - min(60.0, self._ttl * 0.2)

    async def _try_once(self, ttl_header: dict[str, str], started: float) -> str | bool:
        """One token PUT: the token; True when IMDSv2 is unavailable and `imds_v1_fallback`
        lets IMDSv1 be used for a while; False after any other failure (then retried)."""
        try:
            return _token_of(await self._client.request_once("PUT", TOKEN_PATH, headers=ttl_header))
        except ValueError:
            return False
        except MetadataError as exc:
            timed_out = isinstance(exc.__cause__, RequestTimeoutError)
            if timed_out and not self._hinted:
                self._hinted = True
                log.warning(
                    "the IMDSv2 token PUT timed out: in a container the instance's metadata "
                    "hop limit must be 2 (aws ec2 modify-instance-metadata-options "
                    "--http-put-response-hop-limit 2); see docs/aws.md"
                )
            if not self._v1_fallback or exc.status not in V1_FALLBACK_STATUSES:
                return False
            if not self.using_v1:
                log.warning(
                    "no IMDSv2 token (%s); reading IMDS without one (imds_v1_fallback), "
                    "trying the token again in %.0fs",
                    exc,
                    V1_RETRY_SECONDS,
                )
        self.using_v1 = True
        self._token = None
        self._renew_at = started + V1_RETRY_SECONDS
        return True


async def probe(url: str, timeout: float) -> str | None:
    """`provider = "auto"`: None when an EC2 IMDS answers at `url`, else why not.

    IMDSv2 first (a token PUT, then the identity document with it), as the watcher reads it;
    a PUT that times out is named, since on EC2 it is the hop-limit symptom.
    """
    from bridge.infra.buildinfo import user_agent
    from bridge.infra.http1 import Http1Client, TransportError

    client = Http1Client(url, timeout=timeout, user_agent=user_agent())
    try:
        try:
            put = await client.request("PUT", TOKEN_PATH, headers={TTL_HEADER: "60"})
        except TransportError as exc:
            return f"AWS IMDS at {url}: token PUT: {type(exc).__name__} {exc}".strip()
        if put.status != 200:
            return f"AWS IMDS at {url}: token PUT answered HTTP {put.status}"
        try:
            token = _token_of(put)
            got = await client.request("GET", IDENTITY_PATH, headers={TOKEN_HEADER: token})
            parse_identity(got.body)
        except TransportError as exc:
            return f"AWS IMDS at {url}: {type(exc).__name__} {exc}".strip()
        except ValueError as exc:
            return f"AWS IMDS at {url}: no instance identity document ({exc})"
        return None
    finally:
        await client.aclose()


async def check(settings: AwsSource, timeout: float) -> tuple[Literal["ok", "fail"], str, str]:
    """`doctor`'s metadata check on AWS: (verdict, detail, fix).

    The token PUT, then one read with the token. A PUT that times out is the classic IMDSv2
    failure: the answer leaves the instance with an IP TTL of the hop limit (1 by default)
    and dies in a container's network namespace, while the request itself arrived. The fix
    is named, not guessed at.
    """
    client = MetadataClient(settings.imds_url, {}, None, timeout=timeout)
    put = f"PUT {client.base_url}{TOKEN_PATH}"
    try:
        try:
            response = await client.request_once("PUT", TOKEN_PATH, headers={TTL_HEADER: "60"})
            token = _token_of(response)
        except MetadataError as exc:
            if isinstance(exc.__cause__, RequestTimeoutError):
                fallback = "on" if settings.imds_v1_fallback else "off"
                return (
                    "fail",
                    f"{put}: the IMDSv2 token request timed out after {timeout:g}s "
                    f"(imds_v1_fallback is {fallback})",
                    "the answer to the token PUT does not reach this process: in a container "
                    "raise the instance's metadata hop limit to 2 (aws ec2 "
                    "modify-instance-metadata-options --http-put-response-hop-limit 2)",
                )
            return (
                "fail",
                f"{put}: {exc}",
                "IMDS must be enabled with IMDSv2 tokens allowed, and nothing (a proxy adding "
                "X-Forwarded-For, a firewall) may sit in between",
            )
        except ValueError as exc:
            return "fail", f"{put}: {exc}", "is something other than EC2 IMDS answering?"
        try:
            answer = await client.request_once(
                "GET", SPOT_PATH, headers={TOKEN_HEADER: token}, accept=(200, 404)
            )
        except MetadataError as exc:
            return "fail", f"{client.base_url}{SPOT_PATH}: {exc}", ""
    finally:
        await client.aclose()
    return (
        "ok",
        f"{client.base_url}{SPOT_PATH}: HTTP {answer.status} with an IMDSv2 token, "
        "no redirect, no proxy",
        "",
    )
