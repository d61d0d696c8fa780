"""TLS and mutual TLS on the fleet listener, on the real `maintenance-bridge fleet` process,
with certificates each test makes (a CA, server and client certificates, an expired one,
one from another CA).

Checked with a client of our own choosing (Python's `ssl` under httpx): the listener speaks
HTTPS with the configured certificate, refuses a client without a certificate from the
client CA during the handshake, and serves renewed files to new connections without a
restart (and keeps the previous ones when the renewed pair does not match).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import ssl
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridge.fleet.config import parse_fleet_config
from bridge.fleet.service import FleetService
from bridge.infra.validation import ConfigError
from bridge.simulator import Simulator
from tests.fleet.test_end_to_end import PENDING_MAINTENANCE, spooled
from tests.support import eventually, free_port
from tests.test_crash import Process
from tests.tls_certs import TestCa


class Files:
    """A CA, another CA, and the listener's files (`fleet.pem`, `fleet.key`, `clients.pem`)
    that a test replaces the way a certificate agent does (write aside, rename over)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = TestCa(directory / "ca")
        self.other = TestCa(directory / "other", "other CA")
        self.cert = directory / "fleet.pem"
        self.key = directory / "fleet.key"
        self.client_ca = directory / "clients.pem"
        self.install(*self.ca.issue("fleet-1"))
        self.replace(self.client_ca, self.ca.cert)

    def replace(self, target: Path, source: Path) -> None:
        aside = target.with_suffix(".new")
        shutil.copy(source, aside)
        os.replace(aside, target)

    def install(self, cert: Path, key: Path) -> None:
        self.replace(self.cert, cert)
        self.replace(self.key, key)

    def listener(self, mutual: bool) -> dict[str, Any]:
        table = {"tls_cert": str(self.cert), "tls_key": str(self.key)}
        return table | ({"client_ca": str(self.client_ca)} if mutual else {})


@pytest.fixture
def files(tmp_path: Path) -> Files:
    return Files(tmp_path / "pki")


def client(trust: Path, pair: tuple[Path, Path] | None = None, **kwargs: Any) -> httpx.AsyncClient:
    """An HTTPS client trusting `trust`, presenting `pair`; a new connection per request, so
    each request is a new handshake."""
    context = ssl.create_default_context(cafile=str(trust))
    if pair is not None:
        context.load_cert_chain(*pair)
    limits = httpx.Limits(max_keepalive_connections=0)
    return httpx.AsyncClient(verify=context, limits=limits, trust_env=False, **kwargs)


async def peer_subject(url: str, trust: Path, pair: tuple[Path, Path] | None = None) -> str:
    """The common name of the certificate the listener presents to a new connection."""
    async with client(trust, pair) as http, http.stream("GET", f"{url}/healthz") as answer:
        assert answer.status_code == 200
        stream: Any = answer.extensions["network_stream"]
        peer = stream.get_extra_info("ssl_object").getpeercert()
    return str(dict(item[0] for item in peer["subject"])["commonName"])


async def refused(url: str, trust: Path, pair: tuple[Path, Path] | None) -> bool:
    """Whether the listener refuses this client during the handshake (no HTTP answer)."""
    try:
        async with client(trust, pair) as http:
            await http.get(f"{url}/healthz")
    except httpx.TransportError:
        return True
    return False


@pytest.fixture
async def fleet(files: Files, tmp_path: Path) -> AsyncIterator[str]:
    """The real `maintenance-bridge fleet` process with mutual TLS; yields its https url."""
    port = free_port()
    config = tmp_path / "fleet.toml"
    config.write_text(
        f"[fleet.listener]\nport = {port}\n"
        f'tls_cert = "{files.cert}"\ntls_key = "{files.key}"\nclient_ca = "{files.client_ca}"\n'
        f'[fleet.store]\nurl = "sqlite://{tmp_path / "fleet.db"}"\n'
    )
    process = Process(config, "fleet")
    await process.start()
    url = f"https://127.0.0.1:{port}"
    pair = files.ca.issue("probe")

    async def ready() -> bool:
        return not await refused(url, files.ca.cert, pair)

    try:
        await eventually(ready, timeout=30)
        yield url
    finally:
        await process.stop()


async def test_the_fleet_serves_https_and_mutual_tls_on_the_real_process(
    files: Files, fleet: str
) -> None:
    member = files.ca.issue("vm-1")
    async with client(files.ca.cert, member) as http:
        assert (await http.get(f"{fleet}/readyz")).status_code == 200
        assert (await http.get(f"{fleet}/v1/fleet/summary")).status_code == 200
    assert await peer_subject(fleet, files.ca.cert, member) == "fleet-1"
    # Plain HTTP on the TLS port gets no answer a client could take for the API.
    async with httpx.AsyncClient(trust_env=False) as plain:
        with pytest.raises(httpx.TransportError):
            await plain.get(fleet.replace("https", "http") + "/healthz")
    # Refused during the handshake: no certificate, another CA's, an expired one.
    assert await refused(fleet, files.ca.cert, None)
    assert await refused(fleet, files.ca.cert, files.other.issue("intruder"))
    assert await refused(fleet, files.ca.cert, files.ca.issue("stale", expired=True))
    # And a client that does not trust the fleet's CA refuses the fleet.
    assert await refused(fleet, files.other.cert, member)


def tls_1_1_client(trust: Path, pair: tuple[Path, Path]) -> ssl.SSLContext:
    """A client context speaking TLS 1.1 at most (OpenSSL's security level 0 allows it)."""
    context = ssl.create_default_context(cafile=str(trust))
    context.load_cert_chain(*pair)
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():  # the deprecation is the point of the test
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = ssl.TLSVersion.TLSv1_1
    return context


async def test_only_tls_1_2_or_newer_is_spoken(files: Files, fleet: str) -> None:
    old_client = tls_1_1_client(files.ca.cert, files.ca.issue("old-client"))
    # The control: a server that still allows TLS 1.1 does speak it with this client.
    permissive = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    permissive.load_cert_chain(files.cert, files.key)
    permissive.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        permissive.minimum_version = ssl.TLSVersion.TLSv1
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=permissive)
    async with server:
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=old_client)
        assert writer.get_extra_info("ssl_object").version() == "TLSv1.1"
        writer.close()
    with pytest.raises((ConnectionError, ssl.SSLError)):  # the fleet refuses it
        await asyncio.open_connection("127.0.0.1", int(fleet.rsplit(":", 1)[1]), ssl=old_client)


async def test_renewed_files_reach_new_connections_without_a_restart(
    files: Files, fleet: str
) -> None:
    member = files.ca.issue("vm-1")
    files.install(*files.ca.issue("fleet-2"))
    assert await peer_subject(fleet, files.ca.cert, member) == "fleet-2"
    # A renewal caught half way (the certificate written, its key not yet) keeps the last
    # good pair; the key arriving completes it.
    next_cert, next_key = files.ca.issue("fleet-3")
    files.replace(files.cert, next_cert)
    assert await peer_subject(fleet, files.ca.cert, member) == "fleet-2"
    files.replace(files.key, next_key)
    assert await peer_subject(fleet, files.ca.cert, member) == "fleet-3"


async def test_a_new_client_ca_decides_from_the_next_handshake_on(files: Files, fleet: str) -> None:
    old_member = files.ca.issue("vm-old")
    new_member = files.other.issue("vm-new")
    bundle = files.directory / "both.pem"
    bundle.write_bytes(files.ca.cert.read_bytes() + files.other.cert.read_bytes())
    files.replace(files.client_ca, bundle)  # a CA rotation: both trusted for a while
    assert not await refused(fleet, files.ca.cert, old_member)
    assert not await refused(fleet, files.ca.cert, new_member)
    files.replace(files.client_ca, files.other.cert)  # the old CA retired
    assert await refused(fleet, files.ca.cert, old_member)
    assert not await refused(fleet, files.ca.cert, new_member)


async def test_a_broken_renewal_is_logged_and_the_previous_pair_kept(
    files: Files, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    raw = {
        "fleet": {
            "listener": {"port": 0, **files.listener(mutual=False)},
            "store": {"url": f"sqlite://{tmp_path / 'fleet.db'}"},
        }
    }
    service = FleetService(parse_fleet_config(raw))
    async with service.running():
        assert service.url.startswith("https://127.0.0.1:")
        files.replace(files.cert, files.ca.issue("fleet-2")[0])  # not fleet.key's
        assert await peer_subject(service.url, files.ca.cert) == "fleet-1"
        assert "the changed files cannot be used" in caplog.text
        assert f"the key {files.key} does not belong to the certificate {files.cert}" in (
            caplog.text
        )
        assert service.tls is not None
        assert service.tls.error is not None


def problems(listener: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_fleet_config({"fleet": {"listener": listener}})
    return str(caught.value)


def test_the_listener_keys_are_validated_with_reasons(files: Files) -> None:
    assert "fleet.listener.tls_key: required" in problems({"tls_cert": str(files.cert)})
    assert "fleet.listener.client_ca: needs tls_cert and tls_key" in problems(
        {"client_ca": str(files.client_ca)}
    )
    missing = problems({"tls_cert": str(files.directory / "nope.pem"), "tls_key": "x.key"})
    assert "fleet.listener.tls_cert: cannot read" in missing
    assert "nope.pem" in missing
    _, other_key = files.ca.issue("other")
    mismatch = problems({"tls_cert": str(files.cert), "tls_key": str(other_key)})
    assert f"the key {other_key} does not belong to the certificate {files.cert}" in mismatch
    not_pem = files.directory / "not.pem"
    not_pem.write_text("hello")
    assert "holds no PEM certificate" in problems({"tls_cert": str(not_pem), "tls_key": "k"})
    bad_ca = problems({**files.listener(mutual=False), "client_ca": str(not_pem)})
    assert f"fleet.listener.tls_cert: cannot load CA certificates from {not_pem}" in bad_ca


def test_an_expired_certificate_is_a_warning_at_validation(
    files: Files, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    files.install(*files.ca.issue("fleet-stale", expired=True))
    config = parse_fleet_config({"fleet": {"listener": files.listener(mutual=True)}})
    assert config.listener.tls_files() is not None
    assert "EXPIRED" in caplog.text
    assert "CN=fleet-stale" in caplog.text


def test_the_key_may_come_from_the_environment(
    files: Files, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_TLS_KEY", files.key.read_text())
    listener = files.listener(mutual=False) | {"tls_key": "env:FLEET_TLS_KEY"}
    config = parse_fleet_config({"fleet": {"listener": listener}})
    assert "BEGIN" not in repr(config)


ATTEMPTS = "SELECT COALESCE(MAX(attempts), 0) FROM pending"
NAMED_EXPIRED = "SELECT COUNT(*) FROM pending WHERE last_error LIKE '%vm.pem (CN=vm-1,%EXPIRED%'"


def spooled_maintenance(state: Path) -> int:
    """Maintenance events a running sidecar still holds for delivery (read-only; WAL)."""
    return spooled(state, PENDING_MAINTENANCE)


async def test_a_sidecar_reaches_the_fleet_over_mutual_tls_and_waits_out_an_expired_certificate(
    files: Files, fleet: str, tmp_path: Path
) -> None:
    """Two real processes: `maintenance-bridge run` (its webhook sink presenting a client
    certificate) into `maintenance-bridge fleet` (requiring one). The sidecar starts with an
    expired certificate: the maintenance event stays spooled, retried with backoff; the
    certificate is renewed on disk and the event arrives, neither process restarted."""
    vm = tmp_path / "vm"
    vm.mkdir()
    cert, key = vm / "vm.pem", vm / "vm.key"
    stale_cert, stale_key = files.ca.issue("vm-1", expired=True, into=vm / "issued")
    files.replace(cert, stale_cert)
    files.replace(key, stale_key)
    async with Simulator("gce", identity={"gce": {"instance_name": "vm-1"}}) as gce:
        config = vm / "bridge.toml"
        config.write_text(f"""
[source]
provider = "gce"
[source.gce]
metadata_url = "{gce.gce_url}"
[state]
dir = "{vm / "state"}"
[listener]
enabled = false
[delivery]
retry_initial = 0.1
retry_max = 0.5
[heartbeat]
interval = 0
[[sinks]]
type = "webhook"
name = "fleet"
url = "{fleet}/v1/events"
ca_bundle = "{files.ca.cert}"
client_cert = "{cert}"
client_key = "{key}"
""")
        sidecar = Process(config)
        await sidecar.start()
        reader = files.ca.issue("reader")
        try:
            await eventually((vm / "state" / "spool.sqlite3").exists, timeout=30)
            gce.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
            await eventually(lambda: spooled_maintenance(vm / "state") == 1, timeout=30)
            # Retried with backoff (0.1 s doubling to 0.5 s), and the reason names the file.
            named = functools.partial(spooled, vm / "state", NAMED_EXPIRED)
            await eventually(lambda: named() == 1, timeout=10)
            await asyncio.sleep(1.0)
            assert 2 <= spooled(vm / "state", ATTEMPTS) <= 8
            async with client(files.ca.cert, reader) as http:
                assert await maintenance_in_fleet(http, fleet) == []
            fresh_cert, fresh_key = files.ca.issue("vm-1", into=vm / "renewed")
            files.replace(key, fresh_key)
            files.replace(cert, fresh_cert)
            await eventually(lambda: spooled_maintenance(vm / "state") == 0, timeout=30)
            async with client(files.ca.cert, reader) as http:
                delivered = await maintenance_in_fleet(http, fleet)
            assert [(e["subject"], e["data"]["status"]) for e in delivered] == [("vm-1", "started")]
            assert sidecar.proc is not None
            assert sidecar.proc.returncode is None  # never restarted
        finally:
            await sidecar.stop()


async def maintenance_in_fleet(http: httpx.AsyncClient, fleet: str) -> list[dict[str, Any]]:
    answer = await http.get(f"{fleet}/v1/fleet/events?limit=500")
    assert answer.status_code == 200
    events: list[dict[str, Any]] = answer.json()
    return [e for e in events if e["type"].startswith("io.maintenancebridge.maintenance.")]
