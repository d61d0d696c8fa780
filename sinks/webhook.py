"""POSTs each event to an HTTP endpoint as a structured-mode CloudEvent.

HTTP semantics follow the CloudEvents webhook spec: 2xx is delivery, redirects are never
followed, 408/429/5xx and network failures are transient (Retry-After honored), other
4xx are permanent. One `httpx.AsyncClient` per sink keeps the connection alive between
events.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Sequence
from typing import Literal

import httpx
from cloudevents.core.v1.event import CloudEvent
from pydantic import AnyHttpUrl, Field

from bridge.events import serialize
from sinks.base import Health, Ok, Reject, Result, Retry, Sink, SinkConfig

STRUCTURED_CONTENT_TYPE = "application/cloudevents+json; charset=utf-8"
_TRANSIENT_STATUS = frozenset({408, 425, 429})


class Config(SinkConfig):
    type: Literal["webhook"] = "webhook"
    url: AnyHttpUrl
    timeout: float = Field(default=10.0, gt=0)


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Parse a Retry-After header (delta-seconds or an HTTP date) into seconds from now."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def classify_status(response: httpx.Response) -> Result:
    """Map an HTTP answer to a delivery outcome (shared by every HTTP-speaking sink)."""
    status = response.status_code
    if 200 <= status < 300:
        return Ok()
    reason = f"HTTP {status} from {response.request.url}"
    if status in _TRANSIENT_STATUS or status >= 500:
        return Retry(reason, retry_after_seconds(response.headers.get("retry-after")))
    if 300 <= status < 400:
        location = response.headers.get("location", "?")
        return Reject(f"{reason}: redirect to {location} not followed; fix the sink's url")
    return Reject(reason)


class WebhookSink(Sink):
    max_batch = 1

    def __init__(self, name: str, url: str, timeout: float = 10.0) -> None:
        super().__init__(name)
        self.url = url
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout),
            follow_redirects=False,
            trust_env=False,
            headers={"user-agent": "maintenance-bridge"},
        )

    async def _publish(self, batch: Sequence[CloudEvent]) -> Result:
        (event,) = batch
        try:
            response = await self._client.post(
                self.url,
                content=serialize(event),
                headers={"content-type": STRUCTURED_CONTENT_TYPE},
            )
        except httpx.TimeoutException as exc:
            return Retry(f"timeout posting to {self.url}: {type(exc).__name__}")
        except httpx.TransportError as exc:
            return Retry(f"cannot reach {self.url}: {exc or type(exc).__name__}")
        return classify_status(response)

    async def healthcheck(self) -> Health:
        try:
            response = await self._client.request("OPTIONS", self.url)
        except httpx.HTTPError as exc:
            return Health(False, f"cannot reach {self.url}: {exc or type(exc).__name__}")
        return Health(True, f"{self.url} answered HTTP {response.status_code}")

    async def _close(self, timeout: float) -> None:
        await self._client.aclose()


def create(config: Config, name: str) -> WebhookSink:
    return WebhookSink(name, str(config.url), config.timeout)
