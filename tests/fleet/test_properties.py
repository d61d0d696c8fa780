"""Property (issue #29): whatever is posted to a real `maintenance-bridge fleet` process
(arbitrary bodies, content types, `ce-*` headers, event fields replaced by arbitrary JSON),
every answer is 2xx or 4xx, every read endpoint and the page still answer 200 (or 4xx), and
every good event of each batch is stored. Bounded: a few dozen examples, no deadline."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.pipeline.model import Status
from tests.fleet.factories import azure_vm, gce_vm, heartbeat, transition
from tests.fleet.test_bounds import READS
from tests.support import free_port
from tests.test_cli import ROOT

TOKEN = "property-ingest-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
NOW = datetime.now(UTC)
SETTINGS = settings(
    max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


@pytest.fixture(scope="module")
def fleet() -> Iterator[httpx.Client]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="fleet-properties-") as directory:
        port = free_port()
        config = f"{directory}/fleet.toml"
        with open(config, "w") as file:
            file.write(
                f'[fleet.listener]\nport = {port}\n[fleet.store]\nurl = "sqlite://{directory}/f.db"\n'
                f'[[fleet.sources]]\ntype = "http"\ntoken = "{TOKEN}"\n'
            )
        process = subprocess.Popen(
            [sys.executable, "-m", "bridge", "fleet", "--config", config],
            cwd=ROOT,
            stderr=subprocess.DEVNULL,
        )
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        if http.get("/readyz").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    assert time.monotonic() < deadline, "the fleet did not become ready"
                    time.sleep(0.1)
                yield http
        finally:
            process.terminate()
            process.wait(timeout=30)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(
        ["9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00", "2030-01-01T00:00:00Z"]
    ),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
FIELDS = st.sampled_from(
    [
        ("time",),
        ("id",),
        ("source",),
        ("type",),
        ("subject",),
        ("specversion",),
        ("data",),
        ("data", "not_before"),
        ("data", "window"),
        ("data", "spool_depth"),
        ("data", "started_at"),
        ("data", "interval_seconds"),
        ("data", "instance"),
        ("data", "status"),
        ("data", "raw"),
        ("data", "description"),
        ("data", "instance", "name"),
        ("data", "duration_seconds"),
    ]
)


@st.composite
def good_event(draw: st.DrawFn) -> bytes:
    name = draw(
        st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=12)
    )
    vm = gce_vm(name) if draw(st.booleans()) else azure_vm(name)
    at = NOW + timedelta(seconds=draw(st.integers(-86400, 600)))
    if draw(st.booleans()):
        return heartbeat(vm, at, sequence=draw(st.integers(0, 10**6)))
    notice = draw(st.text("abcdef0123456789", min_size=1, max_size=8))
    status = draw(st.sampled_from([Status.SCHEDULED, Status.STARTED, Status.COMPLETED]))
    return transition(vm, notice, status, at, not_before=at + timedelta(hours=1))


@st.composite
def mutated_event(draw: st.DrawFn) -> bytes:
    event: dict[str, Any] = json.loads(draw(good_event()))
    *parents, last = draw(FIELDS)
    target = event
    for key in parents:
        if not isinstance(target.get(key), dict):
            target[key] = {}
        target = target[key]
    target[last] = draw(JSON)
    return json.dumps(event).encode()


#: Bad items of a batch that still parses as a JSON array (one that does not is refused
#: whole, as index 0: there are no events to tell apart; the single posts cover it).
GARBAGE = st.one_of(
    JSON.map(lambda value: json.dumps(value).encode()),
    mutated_event(),
    st.integers(1, 3000).map(lambda depth: b"[" * depth + b"]" * depth),
    mutated_event().map(lambda body: body.replace(b'"', b'"\xff', 1)),
)
ITEM = st.one_of(good_event().map(lambda b: (True, b)), GARBAGE.map(lambda b: (False, b)))


def stored_ids(http: httpx.Client) -> set[tuple[str, str]]:
    found, cursor = set(), 0
    while True:
        page = http.get("/v1/fleet/events", params={"cursor": cursor, "limit": 500})
        assert page.status_code == 200, page.text
        found |= {(event["source"], event["id"]) for event in page.json()}
        if "Fleet-Next-Cursor" not in page.headers:
            return found
        cursor = int(page.headers["Fleet-Next-Cursor"])


def reads_answer(http: httpx.Client) -> None:
    for path in READS:
        answer = http.get(path)
        assert answer.status_code == 200, (path, answer.text[:300])
    eligible = http.get("/v1/fleet/eligible", params={"instance": ["a", "b"]})
    assert eligible.status_code in (200, 503)
    assert "candidates" in eligible.json()


@SETTINGS
@given(items=st.lists(ITEM, min_size=1, max_size=8))
def test_a_batch_of_anything_keeps_its_good_events_and_the_reads(
    fleet: httpx.Client, items: list[tuple[bool, bytes]]
) -> None:
    body = b"[" + b",".join(raw for _, raw in items) + b"]"
    headers = {**AUTH, "content-type": "application/cloudevents-batch+json"}
    answer = fleet.post("/v1/events", content=body, headers=headers)
    assert answer.status_code in (200, 400), answer.text
    good = {i for i, (ok, _) in enumerate(items) if ok}
    if answer.status_code == 400 and "refused" in answer.json():
        refused = {r["index"] for r in answer.json()["refused"]}
        assert not refused & good, answer.json()
    stored = stored_ids(fleet)
    for ok, raw in items:
        if ok:
            event = json.loads(raw)
            assert (event["source"], event["id"]) in stored
    reads_answer(fleet)


#: Printable ASCII without surrounding blanks (what an HTTP client lets through at all).
HEADER_VALUE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30).map(
    str.strip
)


@SETTINGS
@given(
    body=st.one_of(st.binary(max_size=64), mutated_event(), good_event()),
    content_type=st.sampled_from(
        [
            "application/cloudevents+json",
            "application/json",
            "text/plain",
            "",
            "application/cloudevents-batch+json",
        ]
    ),
    attributes=st.dictionaries(
        st.sampled_from(
            [
                "ce-specversion",
                "ce-id",
                "ce-source",
                "ce-type",
                "ce-time",
                "ce-subject",
                "ce-dataschema",
            ]
        ),
        HEADER_VALUE | st.sampled_from(["1.0", "9999-12-31T23:59:59-01:00", "%FF%FE"]),
    ),
)
def test_any_single_post_is_answered_2xx_or_4xx(
    fleet: httpx.Client, body: bytes, content_type: str, attributes: dict[str, str]
) -> None:
    headers = {**AUTH, **attributes}
    if content_type:
        headers["content-type"] = content_type
    answer = fleet.post("/v1/events", content=body, headers=headers)
    assert answer.status_code < 500, answer.text
    reads_answer(fleet)
