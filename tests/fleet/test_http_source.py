"""POST /v1/events: the real webhook sink delivers to the real fleet service, and bad input
is refused with the right status, counted and never committed."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from bridge.fleet.service import FleetService
from bridge.fleet.store import NoticeFilter
from bridge.infra.validation import validate
from bridge.pipeline.events import parse, serialize
from bridge.pipeline.model import Status
from bridge.sinkapi import Ok, Reject
from bridge.transports import webhook_signing as signing
from sinks.webhook import Config as WebhookConfig
from sinks.webhook import WebhookSink
from tests.fleet.conftest import OLD_SECRET, SECRET, FleetFactory
from tests.fleet.factories import T0, azure_vm, gce_vm, heartbeat, transition

SIGNED = [{"type": "http", "secrets": [SECRET, OLD_SECRET]}]
VM = azure_vm("db-1")
STRUCTURED = {"content-type": "application/cloudevents+json"}


def sink(url: str, mode: str, secrets: list[str] | None = None, **more: Any) -> WebhookSink:
    settings: dict[str, Any] = {"type": "webhook", "url": url + "/v1/events", "mode": mode}
    if secrets:
        settings |= {"signing": "standard", "secrets": secrets}
    return WebhookSink("fleet", validate(WebhookConfig, settings | more))


def bodies(count: int) -> list[bytes]:
    return [transition(VM, f"ev-{i}", Status.SCHEDULED, T0, not_before=T0) for i in range(count)]


@pytest.fixture
async def signed(fleet_service: FleetFactory) -> AsyncIterator[FleetService]:
    async with fleet_service(SIGNED) as service:
        yield service


@pytest.mark.parametrize("mode", ["structured", "binary", "batch"])
async def test_the_webhook_sink_delivers_in_every_mode(signed: FleetService, mode: str) -> None:
    events = [parse(body) for body in bodies(3)]
    client = sink(signed.url, mode, [SECRET])
    try:
        if mode == "batch":
            assert isinstance(await client.publish(events), Ok)
        else:
            for event in events:
                assert isinstance(await client.publish([event]), Ok)
        again = await client.publish(events[:1])  # a retried delivery: still a success
    finally:
        await client.close(1.0)
    assert isinstance(again, Ok)
    notices = await signed.store.notices(NoticeFilter())
    assert sorted(n["notice_id"] for n in notices) == ["ev-0", "ev-1", "ev-2"]
    assert (await signed.store.counts())["events"] == 3
    assert signed.stats.counts[("http", "duplicate")] == 1


async def test_a_sink_signing_with_the_old_secret_is_accepted_during_rotation(
    signed: FleetService,
) -> None:
    client = sink(signed.url, "structured", [OLD_SECRET])
    try:
        assert isinstance(await client.publish([parse(bodies(1)[0])]), Ok)
    finally:
        await client.close(1.0)


async def test_bad_signatures_are_401_and_commit_nothing(signed: FleetService) -> None:
    body = bodies(1)[0]
    other = "whsec_" + "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXkwMQ=="
    now = int(time.time())
    cases = {
        "unsigned": {},
        "wrong secret": signing.standard_headers("m1", now, body, [signing.standard_key(other)]),
        "stale": signing.standard_headers("m1", now - 3600, body, [signing.standard_key(SECRET)]),
        "tampered": signing.standard_headers(
            "m1", now, body + b" ", [signing.standard_key(SECRET)]
        ),
    }
    async with httpx.AsyncClient(base_url=signed.url) as http:
        for name, headers in cases.items():
            answer = await http.post("/v1/events", content=body, headers={**STRUCTURED, **headers})
            assert answer.status_code == 401, name
            assert answer.json()["error"]
    assert (await signed.store.counts())["events"] == 0


async def test_a_bearer_token_guards_the_endpoint(fleet_service: FleetFactory) -> None:
    async with fleet_service([{"type": "http", "token": "s3cret-token"}]) as service:
        client = sink(service.url, "batch", bearer_token="s3cret-token")
        try:
            assert isinstance(await client.publish([parse(b) for b in bodies(2)]), Ok)
        finally:
            await client.close(1.0)
        async with httpx.AsyncClient(base_url=service.url) as http:
            wrong = {"authorization": "Bearer nope", **STRUCTURED}
            answer = await http.post("/v1/events", content=bodies(1)[0], headers=wrong)
        assert answer.status_code == 401
        assert (await service.store.counts())["events"] == 2


def _broken(change: dict[str, Any]) -> bytes:
    event = json.loads(bodies(1)[0])
    event["data"].update(change.pop("data", {}))
    event.update(change)
    return json.dumps(event).encode()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            b'{"specversion": "1.0", "id": ',
            "not a CloudEvent of schema v1: Input data was truncated",
        ),
        (_broken({"type": "io.example.unknown"}), "unknown event type 'io.example.unknown'"),
        (_broken({"data": {"kind": "meteor"}}), "Invalid enum value 'meteor' - at `kind`"),
        (_broken({"data": {"status": "completed"}}), "data.status is 'completed'"),
    ],
    ids=["malformed", "unknown-type", "schema-invalid", "type-status-mismatch"],
)
async def test_invalid_events_are_400_naming_the_reason_and_kept_as_rejected(
    fleet_service: FleetFactory, body: bytes, reason: str
) -> None:
    async with fleet_service() as service, httpx.AsyncClient(base_url=service.url) as http:
        answer = await http.post("/v1/events", content=body, headers=STRUCTURED)
        assert answer.status_code == 400
        assert reason in answer.json()["error"]
        (rejected,) = await service.store.rejected()
        assert reason in rejected["reason"]
        assert (await service.store.counts())["events"] == 0
        assert service.stats.counts[("http", "invalid")] == 1


async def test_a_partly_invalid_batch_keeps_the_valid_events_and_names_the_rest(
    fleet_service: FleetFactory,
) -> None:
    good = bodies(2)
    batch = b"[" + b",".join([good[0], _broken({"type": "io.example.x"}), good[1]]) + b"]"
    headers = {"content-type": "application/cloudevents-batch+json"}
    async with fleet_service() as service, httpx.AsyncClient(base_url=service.url) as http:
        answer = await http.post("/v1/events", content=batch, headers=headers)
        assert answer.status_code == 400
        body = answer.json()
        assert (body["accepted"], body["invalid"]) == (2, 1)
        assert body["refused"] == [{"index": 1, "reason": "unknown event type 'io.example.x'"}]
        assert (await service.store.counts())["events"] == 2


async def test_the_webhook_sink_treats_a_refused_event_as_permanent(
    fleet_service: FleetFactory,
) -> None:
    async with fleet_service() as service:
        client = sink(service.url, "structured")
        try:
            result = await client.publish([parse(_broken({"data": {"kind": "meteor"}}))])
        finally:
            await client.close(1.0)
    assert isinstance(result, Reject)


async def test_oversized_bodies_are_413_and_odd_content_types_415(
    fleet_service: FleetFactory,
) -> None:
    sources = [{"type": "http", "max_body": 2048}]
    big = b"[" + b",".join([heartbeat(gce_vm(f"vm-{i}"), T0) for i in range(10)]) + b"]"
    async with fleet_service(sources) as service, httpx.AsyncClient(base_url=service.url) as http:
        batch = {"content-type": "application/cloudevents-batch+json"}
        assert (await http.post("/v1/events", content=big, headers=batch)).status_code == 413

        async def chunks() -> AsyncIterator[bytes]:
            yield big

        chunked = await http.post("/v1/events", content=chunks(), headers=batch)
        assert chunked.status_code == 413
        plain = await http.post("/v1/events", content=b"{}", headers={"content-type": "text/plain"})
        assert plain.status_code == 415
        assert (await service.store.counts())["events"] == 0


def test_unsigned_ingest_is_refused_on_a_non_loopback_listener() -> None:
    from bridge.config import ConfigError
    from bridge.fleet.config import parse_fleet_config

    raw = {"fleet": {"listener": {"host": "0.0.0.0"}, "sources": [{"type": "http"}]}}
    with pytest.raises(ConfigError, match="loopback"):
        parse_fleet_config(raw)
    signed = {
        "fleet": {"listener": {"host": "0.0.0.0"}, "sources": SIGNED, "auth": {"public_read": True}}
    }
    assert parse_fleet_config(signed).listener.host == "0.0.0.0"


def test_a_bad_secret_is_a_configuration_error_that_does_not_echo_it() -> None:
    from bridge.config import ConfigError
    from bridge.fleet.config import parse_fleet_config

    with pytest.raises(ConfigError) as caught:
        parse_fleet_config({"fleet": {"sources": [{"type": "http", "secrets": ["not base64!"]}]}})
    assert "not base64" not in str(caught.value)
    assert "fleet.sources[0].secrets" in str(caught.value)


def test_bodies_helper_is_serialized_by_the_writer() -> None:
    assert serialize(parse(bodies(1)[0])) == bodies(1)[0]
