"""Mutual TLS from the webhook sink, against a real local HTTPS server (aiohttp on 127.0.0.1)
that requires a client certificate from its CA, with certificates each test makes.

The sink presents `client_cert`/`client_key`; a certificate the receiver refuses (another
CA's, an expired one) is named in the delivery's reason, in the log, in the health check
and in `doctor`; the events stay spooled while the dispatcher backs off; renewed files are
used from the next connection on, without a new sink or a restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bridge.config import ConfigError, parse_config
from bridge.pipeline.dispatch import Dispatcher
from bridge.pipeline.sink_checks import SinkChecks
from bridge.pipeline.spool import Spool
from bridge.simulator import Simulator
from bridge.sinkapi import Ok, Retry, Sink
from sinks import webhook
from tests.factories import sample_events
from tests.sinks.test_webhook import rows
from tests.sinks.webhook_receiver import WebhookReceiver
from tests.support import eventually
from tests.test_doctor import config_file, doctor, gce_source, line
from tests.tls_certs import TestCa


@dataclass
class Pki:
    ca: TestCa
    other: TestCa
    directory: Path

    def client(self, stem: str = "client", **kwargs: Any) -> tuple[Path, Path]:
        return self.ca.issue(stem, **kwargs)

    def install(self, pair: tuple[Path, Path]) -> tuple[Path, Path]:
        """Copy `pair` over the files the sink is configured with (`live.pem`/`live.key`),
        each replaced atomically, as a certificate agent does."""
        live = (self.directory / "live.pem", self.directory / "live.key")
        for source, target in zip(pair, live, strict=True):
            shutil.copy(source, target.with_suffix(".new"))
            os.replace(target.with_suffix(".new"), target)
        return live


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(TestCa(tmp_path / "ca"), TestCa(tmp_path / "other", "other CA"), tmp_path)


class MutualTlsReceiver(WebhookReceiver):
    """A receiver requiring a client certificate from `ca`, counting TLS handshakes begun."""

    def __init__(self, pki: Pki) -> None:
        cert, key = pki.ca.issue("receiver")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca.cert))
        context.load_cert_chain(cert, key)
        context.verify_mode = ssl.CERT_REQUIRED
        context.sni_callback = self._hello
        super().__init__(context)
        self.handshakes = 0

    def _hello(self, *_: object) -> None:
        self.handshakes += 1


@pytest.fixture
async def receiver(pki: Pki) -> AsyncIterator[MutualTlsReceiver]:
    server = MutualTlsReceiver(pki)
    await server.start()
    yield server
    await server.stop()


def sink_keys(pki: Pki, pair: tuple[Path, Path] | None) -> dict[str, Any]:
    keys: dict[str, Any] = {"ca_bundle": str(pki.ca.cert)}
    if pair is not None:
        keys |= {"client_cert": str(pair[0]), "client_key": str(pair[1])}
    return keys


@pytest.fixture
async def sinks() -> AsyncIterator[Callable[..., webhook.WebhookSink]]:
    made: list[Sink] = []

    def factory(url: str, **keys: Any) -> webhook.WebhookSink:
        config = parse_config({"sinks": [{"type": "webhook", "name": "hook", "url": url, **keys}]})
        (sink_config,) = config.sinks
        assert isinstance(sink_config, webhook.Config)
        made.append(sink := webhook.create(sink_config, "hook"))
        return sink

    yield factory
    for sink in made:
        await sink.close(1.0)


async def test_the_client_certificate_is_presented_and_accepted(
    pki: Pki, receiver: MutualTlsReceiver, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    sink = sinks(receiver.url, **sink_keys(pki, pki.client()))
    assert await sink.publish(sample_events(1)) == Ok()
    assert len(receiver.posts()) == 1
    assert (await sink.healthcheck()).ok


async def test_without_a_client_certificate_the_receiver_refuses_the_connection(
    pki: Pki, receiver: MutualTlsReceiver, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    result = await sinks(receiver.url, **sink_keys(pki, None)).publish(sample_events(1))
    assert isinstance(result, Retry), result
    assert receiver.posts() == []


async def test_the_key_may_come_from_the_environment(
    pki: Pki,
    receiver: MutualTlsReceiver,
    sinks: Callable[..., webhook.WebhookSink],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cert, key = pki.client()
    monkeypatch.setenv("HOOK_CLIENT_KEY", key.read_text())
    key.unlink()
    keys = sink_keys(pki, (cert, key)) | {"client_key": "env:HOOK_CLIENT_KEY"}
    sink = sinks(receiver.url, **keys)
    assert await sink.publish(sample_events(1)) == Ok()
    assert "BEGIN" not in repr(sink) + repr(parse_config({"sinks": [{"type": "stdout"}]}))


async def test_another_cas_certificate_is_refused_and_named(
    pki: Pki, receiver: MutualTlsReceiver, sinks: Callable[..., webhook.WebhookSink]
) -> None:
    sink = sinks(receiver.url, **sink_keys(pki, pki.other.issue("intruder")))
    result = await sink.publish(sample_events(1))
    assert isinstance(result, Retry), result
    assert "client certificate presented" in result.reason
    assert "CN=intruder, issued by CN=other CA" in result.reason
    health = await sink.healthcheck()
    assert not health.ok
    assert "CN=intruder, issued by CN=other CA" in health.detail
    assert receiver.posts() == []


async def test_an_expired_certificate_keeps_events_spooled_with_backoff_until_renewed(
    pki: Pki,
    receiver: MutualTlsReceiver,
    sinks: Callable[..., webhook.WebhookSink],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    live = pki.install(pki.client("old", expired=True))
    sink = sinks(receiver.url, **sink_keys(pki, live))
    spool = Spool(tmp_path / "state", [sink.name])
    await spool.open()
    events = sample_events(3)
    await spool.commit(rows(events))
    dispatcher = Dispatcher(spool, [sink], retry_initial=0.1, retry_max=0.4)
    checks = SinkChecks([sink], dispatcher.stats)
    dispatcher.start()
    dispatcher.notify()
    try:
        await eventually(lambda: dispatcher.stats[sink.name].retried >= 3)
        # Backed off, not a tight loop: 0.1 s, 0.2 s, then 0.4 s apart (with jitter).
        started = receiver.handshakes
        await asyncio.sleep(1.0)
        assert receiver.handshakes - started <= 5
        # Named in the delivery's reason (hence the log and /readyz) and the health check.
        (ready,) = checks.readiness()
        assert not ready.ok
        assert "EXPIRED" in ready.detail
        assert "CN=old" in ready.detail
        assert "EXPIRED" in caplog.text
        await checks.check(2.0)
        assert "EXPIRED" in checks.last[sink.name].detail
        assert await spool.pending(sink.name, 10) != []
        assert receiver.posts() == []

        pki.install(pki.client("renewed"))
        posts = await receiver.wait_for_posts(3, timeout=10)
    finally:
        await dispatcher.stop(1.0)
    assert [json.loads(p.body)["id"] for p in posts] == [e.get_id() for e in events]
    assert await spool.pending(sink.name, 10) == []
    await spool.close()
    assert "CN=renewed" in caplog.text  # the reload is logged with what was loaded
    await checks.check(2.0)
    assert checks.last[sink.name].ok


async def test_renewed_files_that_do_not_match_keep_the_previous_pair(
    pki: Pki,
    receiver: MutualTlsReceiver,
    sinks: Callable[..., webhook.WebhookSink],
    caplog: pytest.LogCaptureFixture,
) -> None:
    live = pki.install(pki.client("first"))
    sink = sinks(receiver.url, **sink_keys(pki, live))
    assert sink.tls is not None
    in_use = sink.tls.current()
    shutil.copy(pki.client("second")[0], live[0])  # the certificate renewed, its key not (yet)
    assert sink.tls.current() is in_use
    assert "does not belong to the certificate" in caplog.text
    problem = sink.certificate_problem()
    assert problem is not None
    assert "still using the previous files" in problem
    assert await sink.publish(sample_events(1)) == Ok()
    assert "CN=first" in sink.tls.certificate.describe() if sink.tls.certificate else False


def config_problems(**keys: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config({"sinks": [{"type": "webhook", "url": "https://x.example/", **keys}]})
    return str(caught.value)


def test_configuration_errors_name_the_key_and_the_file(pki: Pki) -> None:
    cert, key = pki.client()
    _, other_key = pki.client("other")
    assert "sinks[0].client_key: required" in config_problems(client_cert=str(cert))
    missing = config_problems(client_cert=str(pki.directory / "nope.pem"), client_key=str(key))
    assert "sinks[0].client_cert: cannot read" in missing
    assert "nope.pem" in missing
    mismatch = config_problems(client_cert=str(cert), client_key=str(other_key))
    assert f"the key {other_key} does not belong to the certificate {cert}" in mismatch
    assert "environment variable NOT_SET_ANYWHERE is not set" in config_problems(
        client_cert=str(cert), client_key="env:NOT_SET_ANYWHERE"
    )


def test_an_expired_certificate_is_a_warning_not_an_error(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    cert, key = pki.client("stale", expired=True)
    config = {"type": "webhook", "url": "https://x.example/"}
    parse_config({"sinks": [config | {"client_cert": str(cert), "client_key": str(key)}]})
    assert "EXPIRED" in caplog.text
    assert "CN=stale" in caplog.text


async def test_doctor_names_an_expired_client_certificate(
    gce_sim: Simulator, pki: Pki, receiver: MutualTlsReceiver, tmp_path: Path
) -> None:
    cert, key = pki.client("vm-cert", expired=True)
    config = config_file(tmp_path, gce_source(gce_sim), receiver.url)
    config.write_text(
        config.read_text()
        + f'ca_bundle = "{pki.ca.cert}"\nclient_cert = "{cert}"\nclient_key = "{key}"\n'
    )
    code, output = await doctor(config)
    assert code == 1, output
    assert "FAIL" in line(output, "sink webhook certificate")
    assert "CN=vm-cert" in line(output, "sink webhook certificate")
    assert "EXPIRED" in line(output, "sink webhook certificate")
    assert "no restart needed" in output
    assert "FAIL" in line(output, "sink webhook ")  # the check of the sink itself


async def test_doctor_shows_a_good_client_certificate(
    gce_sim: Simulator, pki: Pki, receiver: MutualTlsReceiver, tmp_path: Path
) -> None:
    cert, key = pki.client("vm-cert")
    config = config_file(tmp_path, gce_source(gce_sim), receiver.url)
    config.write_text(
        config.read_text()
        + f'ca_bundle = "{pki.ca.cert}"\nclient_cert = "{cert}"\nclient_key = "{key}"\n'
    )
    code, output = await doctor(config)
    assert code == 0, output
    assert "presents" in line(output, "sink webhook certificate")
    assert " ok " in line(output, "sink webhook ")
