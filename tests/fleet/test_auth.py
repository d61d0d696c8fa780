"""Who may read and who may write, on the real process (`maintenance-bridge fleet`): scoped
credentials, the page's sign-in, a trusted proxy, credentials refused from the headers before
any body byte, the cap on body bytes in flight, 429 after repeated failures, and binary-mode
signatures that cover the `ce-*` attributes."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.fleet.config import parse_fleet_config
from bridge.fleet.service import FleetService
from bridge.infra.validation import ConfigError
from bridge.pipeline.model import Status
from bridge.transports import webhook_signing as signing
from tests.fleet.conftest import SECRET
from tests.fleet.factories import T0, azure_vm, transition
from tests.support import free_port
from tests.test_cli import ROOT, bridge

READ_TOKEN = "read-token-0123456789abcdef"
ELIGIBLE_TOKEN = "eligible-token-0123456789abcdef"
INGEST_TOKEN = "ingest-token-0123456789abcdef"
STRUCTURED = {"content-type": "application/cloudevents+json"}
KEY = signing.standard_key(SECRET)
VM = azure_vm("db-1")


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def event(notice: str = "ev-1") -> bytes:
    return transition(VM, notice, Status.SCHEDULED, T0, not_before=T0)


def signed_headers(body: bytes, msg_id: str = "m1", **extra: str) -> dict[str, str]:
    return {**STRUCTURED, **signing.standard_headers(msg_id, int(time.time()), body, [KEY])}


class Fleet:
    """A `maintenance-bridge fleet` child process on a free loopback port, and its log."""

    def __init__(self, tmp: Path, auth: str, source: str = "", env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "fleet.log"
        config = tmp / "fleet.toml"
        config.write_text(
            f"[fleet.listener]\nport = {self.port}\n"
            f'[fleet.store]\nurl = "sqlite://{tmp}/fleet.db"\n'
            f'[[fleet.sources]]\ntype = "http"\nsecrets = ["{SECRET}"]\n{source}\n{auth}\n'
        )
        self.config = config
        self.env = {**os.environ, **(env or {})}

    @contextmanager
    def running(self) -> Iterator[Fleet]:
        with self.log.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "bridge", "fleet", "--config", str(self.config)],
                cwd=ROOT,
                env=self.env,
                stderr=log,
            )
        try:
            deadline = time.monotonic() + 30
            while True:
                assert process.poll() is None, self.log.read_text()
                try:
                    if httpx.get(self.url + "/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "the fleet service did not start"
                time.sleep(0.05)
            yield self
        finally:
            process.terminate()
            process.wait(timeout=30)

    def client(self, local_address: str | None = None) -> httpx.Client:
        transport = httpx.HTTPTransport(local_address=local_address)
        return httpx.Client(base_url=self.url, transport=transport, follow_redirects=False)

    def head_only(self, headers: dict[str, str], length: int = 1_000_000) -> tuple[int, bytes]:
        """Send a POST's headers announcing `length` body bytes, and not one of them: the
        answer must come from the headers alone (the socket's 5 s timeout fails the test)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            lines = ["POST /v1/events HTTP/1.1", "Host: fleet", f"Content-Length: {length}"]
            lines += [f"{name}: {value}" for name, value in headers.items()]
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), body


def second_loopback_address() -> str:
    """127.0.0.2, a client address other than 127.0.0.1 (a proxy's, or another client's).
    Linux routes all of 127/8 to loopback; elsewhere the test skips, and fails under CI."""
    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.2", 0))
    except OSError:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            raise
        pytest.skip("127.0.0.2 is not a local address here")
    return "127.0.0.2"


AUTH = f"""
[fleet.auth]
proxy_header = "X-Forwarded-User"
trusted_proxies = ["127.0.0.2/32"]
failures_per_hour = 100000
[[fleet.auth.credentials]]
name = "grafana"
scopes = ["read"]
token = "env:FLEET_TEST_READ_TOKEN"
[[fleet.auth.credentials]]
name = "election"
scopes = ["eligible"]
token = "file:{{eligible}}"
[[fleet.auth.credentials]]
name = "sidecars"
scopes = ["ingest"]
token = "{INGEST_TOKEN}"
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    eligible = tmp / "eligible.token"
    eligible.write_text(ELIGIBLE_TOKEN + "\n")
    service = Fleet(
        tmp,
        AUTH.replace("{eligible}", str(eligible)),
        env={"FLEET_TEST_READ_TOKEN": READ_TOKEN},
    )
    with service.running():
        with service.client() as http:
            assert (
                http.post(
                    "/v1/events", content=event(), headers=bearer(INGEST_TOKEN) | STRUCTURED
                ).status_code
                == 200
            )
        yield service


# -- scopes ---------------------------------------------------------------------------------


READS = [
    "/v1/fleet/notices",
    "/v1/fleet/upcoming",
    "/v1/fleet/instances",
    "/v1/fleet/summary",
    "/v1/fleet/events",
    "/v1/fleet/rejected",
    "/v1/fleet/eligible?instance=db-1",
]


def test_reads_answer_only_a_read_credential(fleet: Fleet) -> None:
    with fleet.client() as http:
        for path in READS:
            anonymous = http.get(path)
            assert anonymous.status_code == 401, path
            assert anonymous.headers["www-authenticate"].startswith("Bearer")
            assert http.get(path, headers=bearer(INGEST_TOKEN)).status_code == 403, path
            assert http.get(path, headers=bearer(READ_TOKEN)).status_code in (200, 503), path
        notices = http.get("/v1/fleet/notices", headers=bearer(READ_TOKEN)).json()
        assert [n["notice_id"] for n in notices["notices"]] == ["ev-1"]


def test_an_eligible_credential_reads_eligible_and_nothing_else(fleet: Fleet) -> None:
    with fleet.client() as http:
        answer = http.get("/v1/fleet/eligible?instance=db-1", headers=bearer(ELIGIBLE_TOKEN))
        assert answer.status_code in (200, 503)
        assert "preferred" in answer.json()
        for path in READS[:-1]:
            denied = http.get(path, headers=bearer(ELIGIBLE_TOKEN))
            assert denied.status_code == 403, path
            assert "'election' does not grant read" in denied.json()["error"]


def test_health_and_local_metrics_stay_open(fleet: Fleet) -> None:
    with fleet.client() as http:
        assert http.get("/healthz").status_code == 200
        assert http.get("/readyz").status_code == 200
        assert http.get("/metrics").status_code == 200  # a loopback listener


def test_an_ingest_credential_posts_and_a_read_credential_cannot(fleet: Fleet) -> None:
    with fleet.client() as http:
        body = event("ev-ingest")
        refused = http.post("/v1/events", content=body, headers=bearer(READ_TOKEN) | STRUCTURED)
        assert refused.status_code == 403
        assert "does not grant ingest" in refused.json()["error"]
        taken = http.post("/v1/events", content=body, headers=bearer(INGEST_TOKEN) | STRUCTURED)
        assert taken.json() == {"accepted": 1, "duplicate": 0, "invalid": 0}
        signed = http.post("/v1/events", content=body, headers=signed_headers(body))
        assert signed.json()["duplicate"] == 1  # the source's secrets keep meaning ingest


# -- the page -------------------------------------------------------------------------------


def test_the_page_sends_to_a_sign_in_that_sets_a_strict_http_only_cookie(fleet: Fleet) -> None:
    with fleet.client() as http:
        away = http.get("/instances/db-1")
        assert away.status_code == 303
        assert away.headers["location"] == "/signin?next=/instances/db-1"
        form = http.get("/signin?next=/instances/db-1")
        assert form.status_code == 200
        assert 'name="token"' in form.text
        for wrong in ("nope", INGEST_TOKEN, ELIGIBLE_TOKEN):
            denied = http.post("/signin", data={"token": wrong, "next": "/"})
            assert denied.status_code == 401
            assert "set-cookie" not in denied.headers
        signed_in = http.post("/signin", data={"token": READ_TOKEN, "next": "/instances/db-1"})
        assert signed_in.status_code == 303
        assert signed_in.headers["location"] == "/instances/db-1"
        cookie = signed_in.headers["set-cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        assert "Max-Age=43200" in cookie
        assert "Secure" not in cookie  # plain HTTP here; a TLS listener adds it
        assert READ_TOKEN not in cookie
        assert http.get("/").status_code == 200  # the client sends the cookie back
        assert http.get("/dashboard/version").status_code == 200
        session = http.cookies["fleet_session"]
        name, expiry, mac = session.rsplit(".", 2)
        http.cookies.set("fleet_session", f"{name}.{int(expiry) + 3600}.{mac}")
        assert http.get("/").status_code == 303  # a lengthened cookie is no cookie
        assert http.post("/signout").status_code == 303


def test_a_forged_or_huge_cookie_is_no_sign_in(fleet: Fleet) -> None:
    forged = [
        "grafana." + "9" * 5000 + ".AAAA",  # past Python's int() limit: was a 500
        f"grafana.{int(time.time()) + 600}.AAAA",
        "grafana",
        "",
    ]
    for value in forged:
        with fleet.client() as http:
            http.cookies.set("fleet_session", value)
            assert http.get("/").status_code == 303
            assert http.get("/v1/fleet/summary").status_code == 401


def test_sign_in_never_sends_anyone_to_another_site(fleet: Fleet) -> None:
    with fleet.client() as http:
        for target in ("//evil.example/", "https://evil.example/", "/\\evil.example"):
            answer = http.post("/signin", data={"token": READ_TOKEN, "next": target})
            assert answer.headers["location"] == "/"


def test_a_proxy_header_counts_only_from_a_trusted_proxy(fleet: Fleet) -> None:
    user = {"X-Forwarded-User": "alice@example.org"}
    with fleet.client() as http:
        assert http.get("/v1/fleet/summary", headers=user).status_code == 401
    with fleet.client(local_address=second_loopback_address()) as proxy:
        assert proxy.get("/v1/fleet/summary", headers=user).status_code == 200
        assert proxy.get("/", headers=user).status_code == 200
        assert proxy.get("/v1/fleet/summary").status_code == 401


# -- refused from the headers alone ---------------------------------------------------------


def test_unauthenticated_posts_are_refused_before_any_body_byte(fleet: Fleet) -> None:
    stamp = str(int(time.time()))
    good_signature = signing.standard_headers("m1", int(stamp), b"x", [KEY])["webhook-signature"]
    cases = {
        "no credential": {},
        "unknown token": bearer("wrong-token-0123456789"),
        "malformed authorization": {"authorization": "Basic YWxhZGRpbjpvcGVuc2VzYW1l"},
        "stale": {
            "webhook-id": "m1",
            "webhook-timestamp": str(int(stamp) - 3600),
            "webhook-signature": good_signature,
        },
        "malformed timestamp": {
            "webhook-id": "m1",
            "webhook-timestamp": "soon",
            "webhook-signature": good_signature,
        },
        "malformed signature": {
            "webhook-id": "m1",
            "webhook-timestamp": stamp,
            "webhook-signature": "v1,not base64!",
        },
    }
    for name, headers in cases.items():
        status, body = fleet.head_only({**STRUCTURED, **headers})
        assert status == 401, name
        assert json.loads(body)["error"], name


@pytest.mark.parametrize(
    "headers",
    [
        {"authorization": "Bearer"},
        {"authorization": "Bearer two words"},
        {"authorization": "Bearer tök€n"},
        {"webhook-id": "m1", "webhook-timestamp": "²³", "webhook-signature": "v1,AAAA"},
        {"webhook-id": "m1", "webhook-timestamp": "9" * 40, "webhook-signature": "v1,AAAA"},
        {"webhook-id": "m1", "webhook-timestamp": "-1", "webhook-signature": "v1,AAAA"},
        {"webhook-id": "m1", "webhook-timestamp": "{now}", "webhook-signature": "v1,é"},
        {"webhook-id": "m1", "webhook-timestamp": "{now}", "webhook-signature": "v1"},
    ],
)
def test_malformed_credentials_are_401_not_500(fleet: Fleet, headers: dict[str, str]) -> None:
    now = str(int(time.time()))
    sent = {
        k.encode(): v.replace("{now}", now).encode() for k, v in {**STRUCTURED, **headers}.items()
    }
    with fleet.client() as http:
        answer = http.post("/v1/events", content=event(), headers=sent)
        assert answer.status_code == 401, answer.text
        read = http.get("/v1/fleet/summary", headers=sent)
        assert read.status_code == 401


# Header values an HTTP/1.1 client can put on the wire (RFC 9110 field-value: visible
# ASCII, blanks inside, bytes 0x80-0xff as obs-text).
_WIRE = frozenset([0x09, *range(0x20, 0x7F), *range(0x80, 0x100)])
_VALUE = st.binary(min_size=1, max_size=200).map(
    lambda raw: bytes(b for b in raw if b in _WIRE).strip(b" \t") or b"x"
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    authorization=st.one_of(st.none(), _VALUE, _VALUE.map(lambda v: b"Bearer " + v)),
    msg_id=st.one_of(st.none(), _VALUE),
    stamp=st.one_of(st.none(), _VALUE, st.integers(-(2**70), 2**70).map(lambda n: str(n).encode())),
    signature=st.one_of(st.none(), _VALUE, _VALUE.map(lambda v: b"v1," + v)),
    cookie=st.one_of(
        st.none(),
        _VALUE.map(lambda v: b"fleet_session=" + v),
        st.text("0123456789", min_size=1, max_size=5000).map(
            lambda n: f"fleet_session=grafana.{n}.AAAA".encode()
        ),
    ),
    binary=st.booleans(),
)
def test_hostile_auth_headers_are_never_a_5xx(
    fleet: Fleet,
    authorization: bytes | None,
    msg_id: bytes | None,
    stamp: bytes | None,
    signature: bytes | None,
    cookie: bytes | None,
    binary: bool,
) -> None:
    given_headers = {
        "authorization": authorization,
        "cookie": cookie,
        "webhook-id": msg_id,
        "webhook-timestamp": stamp,
        "webhook-signature": signature,
    }
    headers = {k.encode(): v for k, v in given_headers.items() if v is not None}
    if binary:
        headers |= {
            b"ce-specversion": b"1.0",
            b"ce-id": b"x",
            b"ce-source": b"//x",
            b"ce-type": b"t",
        }
    else:
        headers[b"content-type"] = STRUCTURED["content-type"].encode()
    with fleet.client() as http:
        posted = http.post("/v1/events", content=b"{}", headers=headers)
        assert 400 <= posted.status_code < 500, posted.text  # 400: refused by the HTTP parser
        read = http.get("/v1/fleet/rejected", headers=headers)
        assert 400 <= read.status_code < 500, read.text


def test_no_token_reaches_the_log(fleet: Fleet) -> None:
    with fleet.client() as http:
        http.get("/v1/fleet/summary", headers=bearer("presented-secret-0123456789"))
        http.post("/signin", data={"token": "typed-secret-0123456789"})
    log = fleet.log.read_text()
    assert "refused" in log
    for token in (READ_TOKEN, INGEST_TOKEN, ELIGIBLE_TOKEN, "presented-secret", "typed-secret"):
        assert token not in log


def test_a_signature_is_checked_as_a_chunked_body_streams_in(fleet: Fleet) -> None:
    body = event("ev-chunked")
    headers = signed_headers(body, msg_id="chunked")

    def pieces(data: bytes) -> Iterator[bytes]:
        yield from (data[i : i + 100] for i in range(0, len(data), 100))

    with fleet.client() as http:
        tampered = body.replace(b"db-1", b"db-9")
        refused = http.post("/v1/events", content=pieces(tampered), headers=headers)
        assert refused.status_code == 401
        assert refused.json()["error"] == "no signature matches a configured secret"
        taken = http.post("/v1/events", content=pieces(body), headers=headers)
        assert taken.json()["accepted"] == 1


def test_an_address_is_throttled_for_the_rest_of_the_hour_only() -> None:
    """The hour passes on an injected clock (no real sleep)."""
    from bridge.fleet.auth import FailureLimiter
    from bridge.fleet.metrics import AuthStats

    now = [1000.0]
    stats = AuthStats()
    limiter = FailureLimiter(2, stats, clock=lambda: now[0])
    limiter.failed("10.0.0.1", "unknown")
    now[0] += 600
    limiter.failed("10.0.0.1", "unknown")
    assert limiter.retry_after("10.0.0.2") is None
    assert limiter.retry_after("10.0.0.1") == 3001
    now[0] += 3001
    assert limiter.retry_after("10.0.0.1") is None  # the first failure left the window
    assert (stats.failures["unknown"], stats.throttled) == (2, 1)


# -- binary mode ----------------------------------------------------------------------------


def binary(body: bytes) -> tuple[dict[str, str], bytes]:
    """The binary-mode form of a structured event, as the webhook sink sends it."""
    parsed = json.loads(body)
    headers = {
        f"ce-{name}": str(value)
        for name, value in parsed.items()
        if name not in ("data", "datacontenttype") and value is not None
    }
    headers["content-type"] = "application/json"
    return headers, json.dumps(parsed["data"]).encode()


def test_a_binary_replay_with_other_attributes_is_refused(fleet: Fleet) -> None:
    attributes, data = binary(event("ev-binary"))
    signed = signing.standard_headers(
        "ev-binary", int(time.time()), data, [KEY], signing.attributes_block(attributes.items())
    )
    with fleet.client() as http:
        original = http.post("/v1/events", content=data, headers={**attributes, **signed})
        assert original.json()["accepted"] == 1
        other_vm = attributes | {"ce-source": attributes["ce-source"].replace("db-1", "db-2")}
        for swapped in (other_vm, attributes | {"ce-id": "ev-other"}):
            replay = http.post("/v1/events", content=data, headers={**swapped, **signed})
            assert replay.status_code == 401
        body_only = signing.standard_headers("ev-binary", int(time.time()), data, [KEY])
        old_sidecar = http.post("/v1/events", content=data, headers={**attributes, **body_only})
        assert old_sidecar.status_code == 401
        assert "binary_unsigned_attributes" in old_sidecar.json()["error"]
        notices = http.get("/v1/fleet/notices", headers=bearer(READ_TOKEN)).json()["notices"]
        assert {n["source"] for n in notices} == {attributes["ce-source"]}


def test_old_binary_sidecars_are_taken_where_the_config_says_so(tmp_path: Path) -> None:
    attributes, data = binary(event("ev-old"))
    body_only = signing.standard_headers("ev-old", int(time.time()), data, [KEY])
    legacy = Fleet(tmp_path, "", source="binary_unsigned_attributes = true")
    with legacy.running() as fleet, fleet.client() as http:
        answer = http.post("/v1/events", content=data, headers={**attributes, **body_only})
        assert answer.json()["accepted"] == 1


# -- bounds ---------------------------------------------------------------------------------


def test_body_bytes_in_flight_are_capped_with_503_and_retry_after(tmp_path: Path) -> None:
    source = "max_body = 4096\nmax_in_flight = 8192"
    auth = "[fleet.auth]\nfailures_per_hour = 0"
    with Fleet(tmp_path, auth, source=source).running() as fleet:
        head = signed_headers(b"anything") | {"Content-Length": "4096"}
        request = ["POST /v1/events HTTP/1.1", "Host: fleet"] + [
            f"{k}: {v}" for k, v in head.items()
        ]
        slow = [socket.create_connection(("127.0.0.1", fleet.port)) for _ in range(2)]
        try:
            for sock in slow:  # two slow senders hold the whole budget
                sock.sendall(("\r\n".join(request) + "\r\n\r\n").encode() + b"{" * 10)
            deadline = time.monotonic() + 10
            with fleet.client() as http:
                while True:
                    answer = http.post(
                        "/v1/events", content=b" " * 4096, headers=signed_headers(b"")
                    )
                    if answer.status_code == 503:
                        break
                    assert time.monotonic() < deadline, answer.status_code
                    time.sleep(0.05)
                assert answer.headers["retry-after"] == "1"
                slow.pop().close()
                deadline = time.monotonic() + 10
                while (
                    http.post(
                        "/v1/events", content=b" " * 4096, headers=signed_headers(b"")
                    ).status_code
                    == 503
                ):
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
        finally:
            for sock in slow:
                sock.close()


def test_a_body_that_does_not_arrive_in_time_is_408_and_frees_its_share(tmp_path: Path) -> None:
    source = "max_body = 4096\nmax_in_flight = 4096\nbody_timeout = 0.5"
    with Fleet(tmp_path, "", source=source).running() as fleet:
        head = signed_headers(b"anything") | {"Content-Length": "4096"}
        request = ["POST /v1/events HTTP/1.1", "Host: fleet"]
        request += [f"{k}: {v}" for k, v in head.items()]
        with socket.create_connection(("127.0.0.1", fleet.port), timeout=5) as sock:
            sock.sendall(("\r\n".join(request) + "\r\n\r\n").encode() + b"[")  # then nothing
            answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408")
        with fleet.client() as http:
            body = event("ev-after")
            assert http.post("/v1/events", content=body, headers=signed_headers(body)).json() == {
                "accepted": 1,
                "duplicate": 0,
                "invalid": 0,
            }


def test_repeated_failures_from_one_address_are_429_and_counted(tmp_path: Path) -> None:
    auth = "[fleet.auth]\nfailures_per_hour = 3"
    with Fleet(tmp_path, auth).running() as fleet:
        with fleet.client() as http:
            for _ in range(3):
                wrong = http.post(
                    "/v1/events",
                    content=event(),
                    headers=bearer("wrong-0123456789abcdef") | STRUCTURED,
                )
                assert wrong.status_code == 401
            throttled = http.post("/v1/events", content=event(), headers=signed_headers(event()))
            assert throttled.status_code == 429  # even a good credential, for a while
            assert 3500 <= int(throttled.headers["retry-after"]) <= 3601
            metrics = http.get("/metrics").text
        assert re.search(r'^fleet_auth_failures_total\{reason="unknown"\} 3$', metrics, re.M)
        assert re.search(r"^fleet_auth_throttled_total 1$", metrics, re.M)
        with fleet.client(local_address=second_loopback_address()) as other:
            ok = other.post("/v1/events", content=event(), headers=signed_headers(event()))
            assert ok.status_code == 200


# -- the configuration ----------------------------------------------------------------------


def test_open_reads_off_loopback_need_public_read_in_words(tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text(
        '[fleet.listener]\nhost = "0.0.0.0"\n'
        f'[fleet.store]\nurl = "sqlite://{tmp_path}/fleet.db"\n'
        f'[[fleet.sources]]\ntype = "http"\nsecrets = ["{SECRET}"]\n'
    )
    done = bridge("fleet", "status", "--config", str(config))  # `status` never listens
    assert done.returncode == 2
    assert "public_read = true" in done.stderr
    raw: dict[str, Any] = {
        "fleet": {
            "listener": {"host": "0.0.0.0"},
            "sources": [{"type": "http", "secrets": [SECRET]}],
            "auth": {"public_read": True},
        }
    }
    assert parse_fleet_config(raw).auth.public_read


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ({"sources": [{"type": "http", "token": ""}]}, "fleet.sources[0].token"),
        ({"sources": [{"type": "http", "token": "  "}]}, "fleet.sources[0].token"),
        (
            {"auth": {"credentials": [{"name": "g", "scopes": ["read"], "token": ""}]}},
            "fleet.auth.credentials[0].token",
        ),
        (
            {"auth": {"credentials": [{"name": "g", "scopes": [], "token": READ_TOKEN}]}},
            "fleet.auth.credentials[0].scopes",
        ),
        ({"auth": {"proxy_header": "X-User"}}, "fleet.auth.trusted_proxies"),
    ],
)
def test_empty_tokens_and_half_configured_auth_are_refused(table: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_fleet_config({"fleet": table})
    assert key in str(caught.value)


def test_metrics_off_loopback_need_read_unless_configured_open(tmp_path: Path) -> None:
    """In-process: the test may not bind anything but loopback, so the service is built for
    0.0.0.0 (which decides what is open) and the check asked directly."""
    credentials = [{"name": "g", "scopes": ["read"], "token": READ_TOKEN}]
    for open_metrics, needed in ((False, "read"), (True, None)):
        raw = {
            "fleet": {
                "listener": {"host": "0.0.0.0"},
                "store": {"url": f"sqlite://{tmp_path}/fleet.db"},
                "sources": [{"type": "http", "secrets": [SECRET]}],
                "auth": {"credentials": credentials, "open_metrics": open_metrics},
            }
        }
        guard = FleetService(parse_fleet_config(raw)).guard
        assert guard.needs(_request("/metrics")) == needed
        assert READ_TOKEN not in repr(guard)


def _request(path: str) -> Any:
    from aiohttp.test_utils import make_mocked_request

    return make_mocked_request("GET", path)
