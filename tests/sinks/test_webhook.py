"""The webhook sink against a real local HTTP server (aiohttp on 127.0.0.1), nothing mocked.

What the receiver gets is read back with the receiving side's own tools: the `cloudevents`
SDK parses every request in its content mode and the `standardwebhooks` library verifies
signatures, so "a receiver can trust it" is checked by the libraries receivers use.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
import hashlib
import hmac
import importlib.util
import ipaddress
import json
import logging
import secrets
import ssl
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings.http import HTTPMessage, from_binary, from_http, from_structured
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from bridge.config import ConfigError, parse_config
from bridge.infra.validation import validate
from bridge.pipeline.dispatch import Dispatcher
from bridge.pipeline.events import as_dict, serialize
from bridge.pipeline.spool import NewEvent, Spool, Spooled
from bridge.sinkapi import Ok, Reject, Retry, Sink
from bridge.transports.webhook_signing import webhook_id
from sinks import webhook
from tests.factories import sample_events
from tests.sinks.contract import SinkContract
from tests.sinks.webhook_receiver import (
    Received,
    RecordingProxy,
    Reply,
    WebhookReceiver,
    serving,
)
from tests.support import assert_valid

ROOT = Path(__file__).resolve().parents[2]
FORMAT = JSONFormat()


def new_secret() -> str:
    import base64

    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def make_sink(url: str, **keys: Any) -> webhook.WebhookSink:
    """A sink built the way the bridge builds it: from a validated `[[sinks]]` table."""
    config = parse_config({"sinks": [{"type": "webhook", "name": "hook", "url": url, **keys}]})
    (sink_config,) = config.sinks
    assert isinstance(sink_config, webhook.Config)
    return webhook.create(sink_config, "hook")


def same_event(got: BaseCloudEvent, sent: CloudEvent) -> None:
    """Equal attributes (time compared as an instant) and equal data; valid against schema."""
    assert got.get_attributes() == sent.get_attributes()
    assert got.get_data() == sent.get_data()
    assert_valid(as_dict(CloudEvent(got.get_attributes(), got.get_data())))


def message(request: Received) -> HTTPMessage:
    return HTTPMessage(headers=request.headers, body=request.body)


def rows(events: Sequence[CloudEvent]) -> list[NewEvent]:
    return [NewEvent(e.get_id(), e.get_source(), e.get_type(), serialize(e)) for e in events]


@pytest.fixture
async def sinks() -> AsyncIterator[Callable[..., webhook.WebhookSink]]:
    """Like `make_sink`, but closes every sink it made at teardown."""
    made: list[Sink] = []

    def factory(url: str, **keys: Any) -> webhook.WebhookSink:
        sink = make_sink(url, **keys)
        made.append(sink)
        return sink

    yield factory
    for sink in made:
        await sink.close(1.0)


# -- the shared contract --------------------------------------------------------------------------


class TestWebhookContract(SinkContract):
    """The sink contract, with signing, a bearer token and a header from a file all on."""

    @pytest.fixture(autouse=True)
    async def _server(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> AsyncIterator[None]:
        self.secret = new_secret()
        self.token = "tok-" + secrets.token_hex(8)
        self.api_key = "key-" + secrets.token_hex(8)
        monkeypatch.setenv("CONTRACT_HOOK_TOKEN", self.token)
        (tmp_path / "api-key").write_text(self.api_key + "\n")
        self.key_file = tmp_path / "api-key"
        self.receiver = await WebhookReceiver().start()
        yield
        await self.receiver.stop()

    async def make_sink(self) -> Sink:
        return make_sink(
            self.receiver.url,
            signing="standard",
            secrets=[self.secret],
            bearer_token="env:CONTRACT_HOOK_TOKEN",
            headers={"X-Api-Key": f"file:{self.key_file}"},
        )

    async def received(self) -> list[dict[str, Any]]:
        got = []
        for request in self.receiver.posts():
            Webhook(self.secret).verify(request.body, request.headers)
            assert request.headers["authorization"] == f"Bearer {self.token}"
            assert request.headers["x-api-key"] == self.api_key
            event = from_http(message(request), FORMAT)
            got.append(assert_valid(as_dict(event)))  # type: ignore[arg-type]
        return got

    async def make_transient_failure(self) -> None:
        self.receiver.default = Reply(503)

    async def make_permanent_failure(self) -> None:
        self.receiver.default = Reply(400)

    def secrets(self) -> list[str]:
        return [self.secret, self.secret.removeprefix("whsec_"), self.token, self.api_key]


# -- content modes, parsed with the cloudevents SDK -----------------------------------------------


async def test_structured_mode_is_one_cloudevent_json_per_request(
    receiver: WebhookReceiver, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    sink = sinks(receiver.url)
    events = sample_events(3)
    for event in events:
        assert await sink.publish([event]) == Ok()
    posts = receiver.posts()
    assert len(posts) == 3
    for request, event in zip(posts, events, strict=True):
        assert request.headers["content-type"] == "application/cloudevents+json; charset=utf-8"
        assert not any(name.startswith("ce-") for name in request.headers)
        same_event(from_structured(message(request), FORMAT, CloudEvent), event)
        same_event(from_http(message(request), FORMAT), event)


async def test_binary_mode_puts_attributes_in_percent_encoded_ce_headers(
    receiver: WebhookReceiver, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    (base,) = sample_events(1)
    attributes = dict(base.get_attributes())
    attributes["subject"] = 'vm 100% "prod" \u2013 zürich'  # space, %, quote and non-ASCII
    event = CloudEvent(attributes, base.get_data())
    sink = sinks(receiver.url, mode="binary")
    assert await sink.publish([event]) == Ok()
    (request,) = receiver.posts()
    assert request.headers["content-type"] == "application/json"
    assert request.headers["ce-id"] == event.get_id()
    assert request.headers["ce-specversion"] == "1.0"
    subject = request.headers["ce-subject"]
    assert subject.isascii()
    assert " " not in subject
    assert '"' not in subject
    assert subject == "vm%20100%25%20%22prod%22%20%E2%80%93%20z%C3%BCrich"
    assert json.loads(request.body) == event.get_data()
    same_event(from_binary(message(request), FORMAT, CloudEvent), event)
    same_event(from_http(message(request), FORMAT), event)


async def test_batch_mode_sends_a_cloudevents_batch(
    receiver: WebhookReceiver, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    sink = sinks(receiver.url, mode="batch", signing="standard", secrets=[new_secret()])
    assert sink.max_batch == webhook.BATCH_SIZE > 1
    events = sample_events(4)
    assert await sink.publish(events) == Ok()
    (request,) = receiver.posts()
    assert request.headers["content-type"] == "application/cloudevents-batch+json; charset=utf-8"
    items = json.loads(request.body)
    assert len(items) == 4
    for item, event in zip(items, events, strict=True):
        same_event(FORMAT.read(CloudEvent, json.dumps(item)), event)
    # A batch has its own stable webhook-id, derived from the ids it carries.
    assert request.headers["webhook-id"] == webhook_id([e.get_id() for e in events])


@pytest.mark.parametrize("mode", ["structured", "binary", "batch"])
async def test_spooled_bytes_go_out_exactly_as_the_parsed_events_would(
    mode: str, receiver: WebhookReceiver, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    """The dispatcher hands a sink the spooled bytes (`publish_encoded`). Structured and
    batch requests carry them as they are, never parsed back; every mode sends exactly the
    request that `publish` sends for the parsed events."""
    secret = new_secret()
    sink = sinks(receiver.url, mode=mode, signing="standard", secrets=[secret])
    events = sample_events(3 if mode == "batch" else 1)
    stored = [Spooled(seq, e.get_id(), serialize(e), 0) for seq, e in enumerate(events)]
    assert await sink.publish(events) == Ok()
    assert await sink.publish_encoded(stored) == Ok()
    from_events, from_bytes = receiver.posts()
    assert from_bytes.body == from_events.body
    if mode == "structured":
        assert from_bytes.body == stored[0].body
    if mode == "batch":
        assert from_bytes.body == b"[" + b",".join(item.body for item in stored) + b"]"
    binding = {k: v for k, v in from_events.headers.items() if k.startswith("ce-")}
    assert {k: v for k, v in from_bytes.headers.items() if k.startswith("ce-")} == binding
    for name in ("content-type", "webhook-id"):
        assert from_bytes.headers[name] == from_events.headers[name]
    Webhook(secret).verify(from_bytes.body, from_bytes.headers)


async def test_structured_and_binary_carry_one_event_per_request(
    sinks: Callable[..., webhook.WebhookSink],
) -> None:
    assert sinks("http://127.0.0.1:9/x").max_batch == 1
    assert sinks("http://127.0.0.1:9/x", mode="binary").max_batch == 1


# -- signatures -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["structured", "binary", "batch"])
async def test_standard_webhooks_signature_verifies_in_every_mode(
    mode: str, receiver: WebhookReceiver, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    secret = new_secret()
    sink = sinks(receiver.url, mode=mode, signing="standard", secrets=[secret])
    (event,) = sample_events(1)
    assert await sink.publish([event]) == Ok()
    (request,) = receiver.posts()
    assert request.headers["webhook-id"] == event.get_id()
    assert abs(int(request.headers["webhook-timestamp"]) - time.time()) < 5
    Webhook(secret).verify(request.body, request.headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(request.body, request.headers)
    with pytest.raises(WebhookVerificationError):  # one byte changed
        Webhook(secret).verify(request.body.replace(b"sim-vm-1", b"sim-vm-2"), request.headers)


async def test_every_configured_secret_signs_for_rotation(
    receiver: WebhookReceiver, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    old, new = new_secret(), new_secret()
    sink = sinks(receiver.url, signing="standard", secrets=[new, old.removeprefix("whsec_")])
    assert await sink.publish(sample_events(1)) == Ok()
    (request,) = receiver.posts()
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    assert all(s.startswith("v1,") for s in request.headers["webhook-signature"].split(" "))
    Webhook(new).verify(request.body, request.headers)
    Webhook(old).verify(request.body, request.headers)


async def test_github_style_signature(
    receiver: WebhookReceiver, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    sink = sinks(receiver.url, signing="github", secrets=["It's a Secret to Everybody"])
    assert await sink.publish(sample_events(1)) == Ok()
    (request,) = receiver.posts()
    expected = hmac.new(b"It's a Secret to Everybody", request.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(request.headers["x-hub-signature-256"], f"sha256={expected}")
    assert "webhook-signature" not in request.headers


async def test_unsigned_by_default(
    receiver: WebhookReceiver, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    assert await sinks(receiver.url).publish(sample_events(1)) == Ok()
    (request,) = receiver.posts()
    assert "webhook-signature" not in request.headers
    assert "x-hub-signature-256" not in request.headers


async def test_retries_through_the_dispatcher_keep_the_webhook_id(
    receiver: WebhookReceiver, sinks: Callable[..., webhook.WebhookSink], tmp_path: Path
) -> None:
    secret = new_secret()
    sink = sinks(receiver.url, signing="standard", secrets=[secret])
    receiver.reply(Reply(503), Reply(500), Reply(429, {"retry-after": "0"}))
    spool = Spool(tmp_path, [sink.name])
    await spool.open()
    events = sample_events(2)
    await spool.commit(rows(events))
    dispatcher = Dispatcher(spool, [sink], retry_initial=0.01, retry_max=0.05)
    dispatcher.start()
    dispatcher.notify()
    try:
        posts = await receiver.wait_for_posts(5)
    finally:
        await dispatcher.stop(1.0)
        await spool.close()
    ids = [p.headers["webhook-id"] for p in posts]
    assert ids == [events[0].get_id()] * 4 + [events[1].get_id()]
    for request in posts:  # every attempt is signed afresh and verifies
        Webhook(secret).verify(request.body, request.headers)
    assert len({p.body for p in posts[:4]}) == 1  # the same bytes each time
    assert dispatcher.stats[sink.name].delivered == 2
    assert dispatcher.stats[sink.name].retried == 3


# -- HTTP semantics -------------------------------------------------------------------------------


async def test_redirects_are_not_followed(
    receiver: WebhookReceiver, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    for status in (301, 302, 307, 308):
        receiver.reply(Reply(status, {"location": f"http://127.0.0.1:{receiver.port}/elsewhere"}))
    sink = sinks(receiver.url)
    for _ in range(4):
        result = await sink.publish(sample_events(1))
        assert isinstance(result, Reject), result
        assert "not followed" in result.reason
    assert [r.path for r in receiver.requests] == ["/hook"] * 4


@pytest.mark.parametrize("status", [413, 415, 400, 404])
async def test_permanent_statuses_reject(
    status: int, receiver: WebhookReceiver, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    receiver.reply(Reply(status, {"retry-after": "5"}))
    result = await sinks(receiver.url).publish(sample_events(1))
    assert isinstance(result, Reject), result
    assert f"HTTP {status}" in result.reason


async def test_429_and_503_honor_retry_after(
    receiver: WebhookReceiver, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    in_two_minutes = email.utils.format_datetime(
        dt.datetime.now(dt.UTC) + dt.timedelta(seconds=120), usegmt=True
    )
    receiver.reply(
        Reply(429, {"retry-after": "7"}),
        Reply(503, {"retry-after": in_two_minutes}),
        Reply(503),
        Reply(408),
    )
    sink = sinks(receiver.url)
    results = [await sink.publish(sample_events(1)) for _ in range(4)]
    assert all(isinstance(r, Retry) for r in results), results
    after = [r.after for r in results if isinstance(r, Retry)]
    assert after[0] == 7.0
    assert after[1] is not None
    assert 110 <= after[1] <= 121
    assert after[2] is None
    assert after[3] is None


async def test_410_disables_the_sink_loudly_and_keeps_events_spooled(
    receiver: WebhookReceiver,
    sinks: Callable[..., webhook.WebhookSink],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    receiver.reply(Reply(410))
    sink = sinks(receiver.url)
    spool = Spool(tmp_path, [sink.name])
    await spool.open()
    await spool.commit(rows(sample_events(2)))
    dispatcher = Dispatcher(spool, [sink], retry_initial=0.01, retry_max=0.05)
    with caplog.at_level(logging.ERROR, logger="sinks.webhook"):
        dispatcher.start()
        dispatcher.notify()
        await receiver.wait_for_posts(1)
        for _ in range(50):
            if sink.disabled:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # a retry would be due by now if the sink were not disabled
    assert sink.disabled
    assert "410" in sink.disabled
    assert len(receiver.posts()) == 1  # nothing more is sent to a gone endpoint
    assert any("DISABLED" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    # Later attempts are refused without a request, at ERROR each time, with a long wait.
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="sinks.webhook"):
        result = await sink.publish(sample_events(1))
    assert isinstance(result, Retry)
    assert result.after == webhook.DISABLED_RETRY_AFTER
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    assert len(receiver.posts()) == 1
    health = await sink.healthcheck()
    await dispatcher.stop(1.0)
    assert len(await spool.pending(sink.name, 10)) == 2  # nothing lost ...
    assert await spool.dead_letters() == []  # ... nor dead-lettered
    await spool.close()
    assert not health.ok
    assert "DISABLED" in health.detail


async def test_timeout_is_configurable_and_a_retry(
    sinks: Callable[..., webhook.WebhookSink],
) -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.Response()

    app = web.Application()
    app.router.add_post("/hook", slow)
    async with serving(app) as url:
        sink = sinks(url, timeout=0.2)
        started = time.monotonic()
        result = await sink.publish(sample_events(1))
        assert time.monotonic() - started < 1.5
        assert isinstance(result, Retry)
        assert "timeout" in result.reason


async def test_unreachable_is_retry(sinks: Callable[..., webhook.WebhookSink]) -> None:
    probe = await WebhookReceiver().start()
    url = probe.url
    await probe.stop()  # nothing listens on that port any more
    result = await sinks(url).publish(sample_events(1))
    assert isinstance(result, Retry)
    assert "cannot reach" in result.reason


# -- connections ----------------------------------------------------------------------------------


async def test_one_client_keeps_the_connection_alive(
    receiver: WebhookReceiver, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    sink = sinks(receiver.url)
    for event in sample_events(6):
        assert await sink.publish([event]) == Ok()
    assert len(receiver.posts()) == 6
    assert len({r.peer_port for r in receiver.posts()}) == 1


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A CA-flagged self-signed certificate for 127.0.0.1 (PEM cert, PEM key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "maintenance-bridge test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


async def test_tls_is_verified_and_ca_bundle_trusts_a_private_ca(
    tmp_path: Path, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = await WebhookReceiver(context).start()
    try:
        untrusted = await sinks(server.url).publish(sample_events(1))
        assert isinstance(untrusted, Retry), untrusted
        assert "CERTIFICATE_VERIFY_FAILED" in untrusted.reason
        assert server.posts() == []
        trusted = await sinks(server.url, ca_bundle=str(cert)).publish(sample_events(1))
        assert trusted == Ok()
        assert len(server.posts()) == 1
    finally:
        await server.stop()


@pytest.fixture
async def proxy() -> AsyncIterator[RecordingProxy]:
    server = await RecordingProxy().start()
    yield server
    await server.stop()


async def test_a_configured_proxy_is_used(
    receiver: WebhookReceiver,
    proxy: RecordingProxy,
    sinks: Callable[..., webhook.WebhookSink],
) -> None:
    sink = sinks(receiver.url, proxy=proxy.url)
    assert await sink.publish(sample_events(1)) == Ok()
    assert proxy.request_lines == [f"POST {receiver.url} HTTP/1.1"]
    assert receiver.requests == []


async def test_environment_proxies_are_ignored(
    receiver: WebhookReceiver,
    proxy: RecordingProxy,
    sinks: Callable[..., webhook.WebhookSink],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy.url)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert await sinks(receiver.url).publish(sample_events(1)) == Ok()
    assert proxy.request_lines == []
    assert len(receiver.posts()) == 1


# -- credentials ----------------------------------------------------------------------------------


async def test_bearer_token_and_headers_from_env_and_file_are_sent_but_never_shown(
    receiver: WebhookReceiver,
    sinks: Callable[..., webhook.WebhookSink],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    token, api_key, secret = (
        "t0k3n-" + secrets.token_hex(6),
        "k3y-" + secrets.token_hex(6),
        new_secret(),
    )
    monkeypatch.setenv("HOOK_TOKEN", token)
    (tmp_path / "key").write_text(api_key)
    with caplog.at_level(logging.DEBUG):
        sink = sinks(
            receiver.url,
            bearer_token="env:HOOK_TOKEN",
            headers={"X-Api-Key": f"file:{tmp_path / 'key'}", "X-Team": "sre"},
            signing="standard",
            secrets=[secret],
        )
        assert await sink.publish(sample_events(1)) == Ok()
        receiver.default, receiver.options_status = Reply(401), 401
        failed = await sink.publish(sample_events(1))
        health = await sink.healthcheck()
    assert isinstance(failed, Reject)
    assert not health.ok
    request = receiver.posts()[0]
    assert request.headers["authorization"] == f"Bearer {token}"
    assert request.headers["x-api-key"] == api_key
    assert request.headers["x-team"] == "sre"
    shown = [repr(sink), str(sink), repr(vars(sink)), failed.reason, health.detail]
    shown += [r.getMessage() for r in caplog.records]
    shown += [repr(c) for c in (sink_config(receiver.url, bearer_token=token, secrets=[secret]),)]
    for text in shown:
        for value in (token, api_key, secret, secret.removeprefix("whsec_")):
            assert value not in text


def sink_config(url: str, **keys: Any) -> webhook.Config:
    return validate(webhook.Config, {"type": "webhook", "url": url, "signing": "standard", **keys})


async def test_credentials_in_the_url_are_not_shown(
    receiver: WebhookReceiver, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    url = receiver.url.replace("http://", "http://user:hunter2@") + "?token=hunter3"
    receiver.default = Reply(500)
    sink = sinks(url)
    result = await sink.publish(sample_events(1))
    assert isinstance(result, Retry)
    for text in (result.reason, repr(sink)):
        assert "hunter2" not in text
        assert "hunter3" not in text


# -- abuse-protection handshake -------------------------------------------------------------------


async def test_handshake_is_done_once_and_remembered_until_a_failure(
    receiver: WebhookReceiver, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    receiver.allowed_origin = "bridge.example.com"
    sink = sinks(receiver.url, handshake_origin="bridge.example.com")
    for event in sample_events(3):
        assert await sink.publish([event]) == Ok()
    (options,) = receiver.options()
    assert options.headers["webhook-request-origin"] == "bridge.example.com"
    assert [r.method for r in receiver.requests] == ["OPTIONS", "POST", "POST", "POST"]
    assert all(p.headers["origin"] == "bridge.example.com" for p in receiver.posts())
    receiver.reply(Reply(503))
    assert isinstance(await sink.publish(sample_events(1)), Retry)
    assert await sink.publish(sample_events(1)) == Ok()  # asks again after the failure
    assert [r.method for r in receiver.requests][4:] == ["POST", "OPTIONS", "POST"]


@pytest.mark.parametrize(
    ("status", "allowed", "rate"),
    [
        (200, None, None),
        (200, "someone-else.example.com", None),
        (405, None, None),
        (200, "bridge.example.com", "lots"),
    ],
)
async def test_handshake_refused_sends_nothing_and_keeps_events(
    status: int,
    allowed: str | None,
    rate: str | None,
    receiver: WebhookReceiver,
    sinks: Callable[..., webhook.WebhookSink],
    caplog: pytest.LogCaptureFixture,
) -> None:
    receiver.options_status, receiver.allowed_origin, receiver.allowed_rate = status, allowed, rate
    sink = sinks(receiver.url, handshake_origin="bridge.example.com")
    with caplog.at_level(logging.ERROR, logger="sinks.webhook"):
        result = await sink.publish(sample_events(1))
    assert isinstance(result, Retry), result
    assert result.after == webhook.HANDSHAKE_DENIED_RETRY_AFTER
    assert "did not grant" in result.reason
    assert receiver.posts() == []
    assert caplog.records
    assert not (await sink.healthcheck()).ok


async def test_handshake_allowed_rate_is_kept_without_sleeping(
    receiver: WebhookReceiver, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    receiver.allowed_origin, receiver.allowed_rate = "*", "2"
    sink = sinks(receiver.url, handshake_origin="bridge.example.com")
    events = sample_events(3)
    assert await sink.publish([events[0]]) == Ok()
    assert await sink.publish([events[1]]) == Ok()
    started = time.monotonic()
    throttled = await sink.publish([events[2]])
    assert time.monotonic() - started < 0.5
    assert isinstance(throttled, Retry), throttled
    assert throttled.after is not None
    assert 55 < throttled.after <= 60
    assert len(receiver.posts()) == 2


async def test_healthcheck(
    receiver: WebhookReceiver, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    assert (await sinks(receiver.url).healthcheck()).ok
    receiver.allowed_origin = "bridge.example.com"
    health = await sinks(receiver.url, handshake_origin="bridge.example.com").healthcheck()
    assert health.ok, health


# -- configuration --------------------------------------------------------------------------------


def config_problems(**keys: Any) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config({"sinks": [{"type": "webhook", "url": "https://hooks.example.com/", **keys}]})
    return str(info.value)


def test_defaults() -> None:
    config = sink_config("https://hooks.example.com/x", signing="none")
    assert (config.mode, config.signing, config.timeout) == ("structured", "none", 10.0)
    assert config.proxy is None
    assert config.ca_bundle is None
    assert config.handshake_origin is None


def test_configuration_errors_name_the_key_and_never_echo_secrets() -> None:
    assert "unknown key" in config_problems(retries=3)
    assert "mode" in config_problems(mode="grpc")
    assert "needs at least one entry in secrets" in config_problems(signing="standard")
    assert 'signing = "none"' in config_problems(secrets=[new_secret()])
    bad = "whsec_not*base64!"
    text = config_problems(signing="standard", secrets=[new_secret(), bad])
    assert "secrets[1]" in text
    assert bad not in text
    assert "not*base64" not in text
    assert "set by the sink itself" in config_problems(headers={"Content-Type": "text/plain"})
    assert "set by the sink itself" in config_problems(headers={"ce-id": "x"})
    assert "set by the sink itself" in config_problems(headers={"webhook-signature": "v1,x"})
    assert "not both" in config_problems(bearer_token="a", headers={"Authorization": "b"})
    assert "line break" in config_problems(headers={"X-A": "a\r\nX-Injected: 1"})
    assert "env" in config_problems(bearer_token="env:SURELY_NOT_SET_ANYWHERE_42")
    assert "ca_bundle" in config_problems(ca_bundle="/nonexistent/ca.pem")
    assert "handshake_origin" in config_problems(handshake_origin="")


def test_invalid_ca_bundle_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("not a certificate")
    assert "cannot load CA certificates" in config_problems(ca_bundle=str(tmp_path / "ca.pem"))


# -- the documented receiver example --------------------------------------------------------------


def load_example() -> Any:
    path = ROOT / "docs" / "examples" / "webhook_receiver.py"
    spec = importlib.util.spec_from_file_location("webhook_receiver_example", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("mode", ["structured", "binary", "batch"])
async def test_documented_receiver_example_verifies_and_parses(
    mode: str, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    example = load_example()
    secret = new_secret()
    handled: list[BaseCloudEvent] = []

    async def handle(event: BaseCloudEvent) -> None:
        handled.append(event)

    app: web.Application = example.make_app(
        secret, handle, allowed_origins=frozenset({"bridge.example.com"})
    )
    async with serving(app) as url:
        events = sample_events(3)
        sink = sinks(
            url,
            mode=mode,
            signing="standard",
            secrets=[secret],
            handshake_origin="bridge.example.com",
        )
        if mode == "batch":
            assert await sink.publish(events) == Ok()
        else:
            for event in events:
                assert await sink.publish([event]) == Ok()
        again = events if mode == "batch" else [events[0]]
        assert await sink.publish(again) == Ok()  # a redelivery is acknowledged, handled once
        forged = sinks(url, mode=mode, signing="standard", secrets=[new_secret()])
        assert isinstance(await forged.publish(sample_events(1)), Reject)
        stranger = sinks(url, mode=mode, handshake_origin="evil.example.com")
        assert isinstance(await stranger.publish(sample_events(1)), Retry)
    assert len(handled) == 3
    for got, sent in zip(handled, events, strict=True):
        same_event(got, sent)


def test_the_documented_example_is_the_tested_file() -> None:
    """docs/webhook.md shows the receiver verbatim, so the copy-paste version cannot rot."""
    doc = (ROOT / "docs" / "webhook.md").read_text(encoding="utf-8")
    example = (ROOT / "docs" / "examples" / "webhook_receiver.py").read_text(encoding="utf-8")
    blocks = doc.split("```python\n")[1:]
    assert any(block.split("```", 1)[0] == example for block in blocks)


def test_the_documented_keys_are_the_config_keys() -> None:
    doc = (ROOT / "docs" / "webhook.md").read_text(encoding="utf-8")
    table = doc.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    documented = {line.split("`")[1] for line in table.splitlines() if line.startswith("| `")}
    assert documented == set(webhook.Config.__struct_fields__) - {"type", "name"}
