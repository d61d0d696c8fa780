"""One Retry-After parser (`bridge.infra.backoff.parse_retry_after`) for the metadata client
and the webhook sink alike: delta-seconds or an HTTP date, anything else ignored."""

from __future__ import annotations

from email.utils import formatdate

import pytest

from bridge.infra import backoff
from bridge.infra.backoff import parse_retry_after
from bridge.infra.http1 import Response
from bridge.pipeline.watchers import http as metadata_http
from sinks import webhook

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("7", 7.0),
        (" 120 ", 120.0),
        (formatdate(NOW + 30, usegmt=True), 30.0),
        (formatdate(NOW - 30, usegmt=True), 0.0),  # a date in the past: now
        (None, None),
        ("", None),
        ("soon", None),
        ("-5", None),
        ("1.5", None),
    ],
)
def test_seconds_and_http_dates(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value, now=NOW) == seconds


def test_the_metadata_client_and_the_webhook_sink_use_the_same_parser() -> None:
    assert vars(webhook)["parse_retry_after"] is backoff.parse_retry_after
    assert vars(metadata_http)["parse_retry_after"] is backoff.parse_retry_after


def test_the_metadata_client_honours_an_http_date_too() -> None:
    response = Response(503, {"retry-after": formatdate(usegmt=True)}, b"")
    asked = metadata_http._retry_after(response)
    assert asked is not None
    assert 0.0 <= asked <= 1.0
