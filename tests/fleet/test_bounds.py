"""One bad event stays one bad event (issue #29): a real `maintenance-bridge fleet` process on
SQLite and on PostgreSQL refuses, with a reason, what the schema admits but the store cannot
keep or the reads cannot show (`bridge.fleet.bounds`), commits the rest of the batch, keeps
answering every read, and takes the next sender's events at once (no transaction left open).
Query parameters, clock skew and readiness are pinned here too."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridge import contract
from bridge.fleet import bounds, connections
from bridge.infra import platform
from bridge.infra.platform import limits
from bridge.pipeline.model import Status
from tests.contract_samples import every_type
from tests.fleet.conftest import FleetFactory
from tests.fleet.factories import azure_vm, gce_vm, heartbeat, transition
from tests.fleet.poison import BEFORE_1, PAST_9999, nested, poison
from tests.support import eventually, free_port
from tests.test_cli import ROOT

pytest_plugins = ["tests.fleet.postgres_server"]

BATCH = {"content-type": "application/cloudevents-batch+json"}
STRUCTURED = {"content-type": "application/cloudevents+json"}
READS = [
    "/v1/fleet/notices",
    "/v1/fleet/upcoming",
    "/v1/fleet/instances",
    "/v1/fleet/summary",
    "/v1/fleet/events",
    "/v1/fleet/rejected",
    "/metrics",
    "/",
]


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'fleet.sqlite3'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


#: Sets the limits `fleet_process` was given (argv[1], JSON), then becomes the fleet.
LAUNCH_LIMITED = """
import json, os, sys
from bridge.infra.platform import limits
file_size, files, fixed = json.loads(sys.argv[1])
if file_size is not None:
    limits.set_file_size_limit(file_size)
if files is not None:
    limits.set_file_limit(files, files if fixed else None)
os.execv(sys.executable, [sys.executable, "-m", "bridge", "fleet", "--config", sys.argv[2]])
"""


@asynccontextmanager
async def fleet_process(
    tmp_path: Path,
    store_url: str,
    file_size: int | None = None,
    files: int | None = None,
    fixed_files: bool = False,
) -> AsyncIterator[httpx.AsyncClient]:
    """`maintenance-bridge fleet` on a free port, ready; `file_size` caps every file it writes
    (RLIMIT_FSIZE: a write past it fails as on a full disk; Python ignores SIGXFSZ); `files`
    is its soft open-file limit at start (the common default is 1,024), and its hard one too
    when `fixed_files` (a limit it cannot raise)."""
    port = free_port()
    config = tmp_path / "fleet.toml"
    config.write_text(
        f'[fleet.listener]\nport = {port}\n[fleet.store]\nurl = "{store_url}"\n'
        '[[fleet.sources]]\ntype = "http"\n'
    )

    # The limits are set by a launcher that then execs the fleet, not by `preexec_fn`:
    # Python code run between fork and exec of a multi-threaded parent (pytest holds
    # threads of earlier tests) can deadlock or abort the child, which once killed a
    # fleet before it was ready (SIGABRT) in CI.
    stderr = (tmp_path / "fleet.stderr").open("wb")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        LAUNCH_LIMITED,
        json.dumps([file_size, files, fixed_files]),
        str(config),
        cwd=ROOT,
        stderr=stderr,
    )
    stderr.close()  # the child holds its own copy
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:

            async def ready() -> bool:
                try:
                    return (await http.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            try:
                await eventually(ready, timeout=30)
            except AssertionError:
                said = (tmp_path / "fleet.stderr").read_text(errors="replace")
                raise AssertionError(
                    f"the fleet was not ready (exit {process.returncode}): {said[-2000:]}"
                ) from None
            yield http
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()


async def reads_answer(http: httpx.AsyncClient) -> None:
    for path in READS:
        answer = await http.get(path)
        assert answer.status_code == 200, (path, answer.text[:300])
    eligible = await http.get("/v1/fleet/eligible", params={"instance": ["web-1", "poison-1"]})
    assert eligible.status_code in (200, 503), eligible.text
    assert "candidates" in eligible.json()


async def test_out_of_bounds_events_are_refused_by_index_and_the_rest_of_the_batch_is_kept(
    tmp_path: Path, store_url: str
) -> None:
    now = datetime.now(UTC)
    web = gce_vm("web-1")
    good = [heartbeat(web, now), transition(web, "g-1", Status.SCHEDULED, now, not_before=now)]
    bad = poison(now)
    bodies = [good[0], *bad.values(), nested(100_000), good[1]]
    body = b"[" + b",".join(bodies) + b"]"
    async with fleet_process(tmp_path, store_url) as http:
        answer = await http.post("/v1/events", content=body, headers=BATCH)
        assert answer.status_code == 400, answer.text
        result = answer.json()
        assert (result["accepted"], result["invalid"]) == (2, len(bad) + 1)
        refused = {r["index"]: r["reason"] for r in result["refused"]}
        assert sorted(refused) == list(range(1, len(bodies) - 1))
        assert "outside years 1-9999" in refused[1]
        assert "outside signed 64 bits" in refused[5]
        assert "not UTF-8" in refused[9]
        assert "nested deeper than 64" in refused[10]
        await reads_answer(http)
        rejected = (await http.get("/v1/fleet/rejected")).json()
        assert rejected["count"] == len(bad) + 1
        # The next sender, well-formed, is served at once: nothing was left half done.
        later = heartbeat(azure_vm("db-1"), now)
        assert (await http.post("/v1/events", content=later, headers=STRUCTURED)).json() == {
            "accepted": 1,
            "duplicate": 0,
            "invalid": 0,
        }
        names = [i["name"] for i in (await http.get("/v1/fleet/instances")).json()["instances"]]
        assert names == ["db-1", "web-1"]


def _respelled(body: bytes) -> list[bytes]:
    """`body` as a sender may write it: as is, compact, and with every time's first digit and
    every long integer's sign spelled otherwise (an escape, spaces)."""
    compact = json.dumps(json.loads(body), separators=(",", ":")).encode()
    escaped = body.replace(b'"9999-', b'"\\u0039999-').replace(b'"0001-', b'"\\u0030001-')
    return [body, compact, escaped, body.replace(b": 9", b":\n  9")]


@pytest.mark.parametrize("name", sorted(poison(datetime.now(UTC))))
def test_the_bounds_refuse_an_event_however_it_is_spelled(name: str) -> None:
    """`bounds.event` walks an event's values only when its bytes could hold what the walk
    refuses (a scan in C, the walk in Python): whatever the spelling, a poison is refused."""
    for body in _respelled(poison(datetime.now(UTC))[name]) if name != "not UTF-8" else []:
        with pytest.raises(contract.ContractError):
            bounds.event(body)


def test_a_negative_integer_past_64_bits_is_refused_written_compactly() -> None:
    event = json.loads(poison(datetime.now(UTC))["nested 100 deep"])
    event["data"]["raw"] = [-(2**63) - 1]
    with pytest.raises(bounds.OutOfBounds, match="outside signed 64 bits"):
        bounds.event(json.dumps(event, separators=(",", ":")).encode())


def test_the_fast_path_takes_long_digit_strings_and_edge_years_in_text() -> None:
    """What only looks like a bound (a 19-digit id, a year 9999 in a description) is valid."""
    event = json.loads(heartbeat(gce_vm("web-1"), datetime.now(UTC)))
    event["data"]["instance"]["id"] = "92233720368547758080"
    event["data"]["note"] = '"9999-12-31 is far, [1,[2,[3]]] is not deep'
    for body in _respelled(json.dumps(event).encode()):
        assert bounds.event(body).data.instance.id == "92233720368547758080"


def _times(value: Any, path: str = "") -> list[str]:
    """The path of every time in a JSON event (`data.window.start`), as `check_times` names
    them."""
    if isinstance(value, dict):
        return [
            found
            for key, item in value.items()
            for found in _times(item, f"{path}.{key}" if path else key)
        ]
    if isinstance(value, str) and value[:4].isdigit() and "T" in value and value[-1] == "Z":
        return [path]
    return []


def _set(event: dict[str, Any], path: str, value: str) -> bytes:
    *parents, last = path.split(".")
    node = event
    for key in parents:
        node = node[key]
    node[last] = value
    return json.dumps(event).encode()


@pytest.mark.parametrize("event_type", sorted(every_type()))
def test_every_time_of_every_type_is_kept_within_years_1_to_9999(event_type: str) -> None:
    """Only a time in year 1 or 9999 is walked (`bounds._in_edge_year` reads the typed
    event's time fields): each time of each type, a budget's and a window's included, is
    refused past year 9999 or before year 1 in UTC, and kept at the edge within them."""
    body = every_type()[event_type]
    paths = _times(json.loads(body))
    assert "time" in paths
    assert len(paths) >= 2
    for path in paths:
        for out in (PAST_9999, BEFORE_1):
            with pytest.raises(bounds.OutOfBounds, match=f"^{path}: .* outside years 1-9999"):
                bounds.event(_set(json.loads(body), path, out))
        for edge in ("9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "9999-12-31T12:00:00+05:00"):
            assert bounds.event(_set(json.loads(body), path, edge)).type == event_type


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (b'{"specversion": "1.0", "id": "caf\xe9"}', STRUCTURED),
        (nested(100_000), STRUCTURED),
        (nested(100_000), {"ce-specversion": "1.0", "content-type": "application/json"}),
        (b"[" * 100_000, BATCH),
        (b'"\xff"', {"ce-specversion": "1.0", "content-type": "application/json"}),
    ],
    ids=["not-utf8", "deep", "deep-binary", "deep-batch", "not-utf8-binary"],
)
async def test_unreadable_bodies_are_400_and_the_service_goes_on(
    tmp_path: Path, body: bytes, headers: dict[str, str]
) -> None:
    async with fleet_process(tmp_path, f"sqlite://{tmp_path / 'f.sqlite3'}") as http:
        answer = await http.post("/v1/events", content=body, headers=headers)
        assert answer.status_code == 400, answer.text
        assert answer.json()["refused"][0]["index"] == 0
        await reads_answer(http)
        beat = heartbeat(gce_vm("web-1"), datetime.now(UTC))
        assert (await http.post("/v1/events", content=beat, headers=STRUCTURED)).status_code == 200


BAD_QUERIES: list[tuple[str, dict[str, str | list[str]], str]] = [
    ("/v1/fleet/events", {"cursor": str(2**63)}, "cursor"),
    ("/v1/fleet/events", {"cursor": "-1"}, "cursor"),
    ("/v1/fleet/events", {"limit": "0"}, "limit"),
    ("/v1/fleet/events", {"since": "nan"}, "since"),
    ("/v1/fleet/events", {"until": "inf"}, "until"),
    ("/v1/fleet/events", {"since": "1e300"}, "since"),
    ("/v1/fleet/events", {"since": "9999-12-31T23:59:59-01:00"}, "since"),
    ("/v1/fleet/notices", {"status": "schedueld"}, "scheduled, started, completed, cancelled"),
    ("/v1/fleet/notices", {"provider": "gcp"}, "gce, azure, aws"),
    ("/v1/fleet/notices", {"kind": "reboots"}, "live-migrate, terminate"),
    ("/v1/fleet/instances", {"state": "alive"}, "reporting, silent"),
    ("/v1/fleet/upcoming", {"within": "9" * 400}, "at most"),
    ("/v1/fleet/eligible", {"horizon": "99999999d", "instance": "a"}, "at most"),
    ("/v1/fleet/eligible", {"instance": ["a"] * 501}, "at most 500"),
]


async def test_every_bad_query_parameter_is_a_400_naming_it(tmp_path: Path) -> None:
    async with fleet_process(tmp_path, f"sqlite://{tmp_path / 'f.sqlite3'}") as http:
        for path, query, named in BAD_QUERIES:
            answer = await http.get(path, params=query)
            assert answer.status_code == 400, (path, query, answer.text)
            error = answer.json()["error"]
            assert error.startswith(f"{next(iter(query))}:"), error
            assert named in error, error


async def test_a_heartbeat_from_a_clock_a_day_ahead_does_not_keep_a_dead_vm_reporting(
    tmp_path: Path, store_url: str
) -> None:
    ahead = datetime.now(UTC) + timedelta(days=1)
    beat = heartbeat(gce_vm("web-1"), ahead, interval=0.5)
    async with fleet_process(tmp_path, store_url) as http:
        assert (await http.post("/v1/events", content=beat, headers=STRUCTURED)).status_code == 200

        async def silent() -> bool:
            (instance,) = (await http.get("/v1/fleet/instances")).json()["instances"]
            return bool(instance["state"] == "silent")

        # Three intervals (1.5 s) after it was received, not a day.
        await eventually(silent, timeout=15)


async def test_readyz_is_not_ready_while_the_store_cannot_commit(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    url = f"sqlite://{tmp_path / 'f.sqlite3'}"

    def big(i: int) -> bytes:
        event = json.loads(transition(gce_vm(f"vm-{i}"), f"n-{i}", Status.SCHEDULED, now))
        event["data"]["description"] = "x" * 60_000
        return json.dumps(event).encode()

    async with fleet_process(tmp_path, url, file_size=3 * 1024 * 1024) as http:
        status, i = 200, 0
        while status == 200 and i < 40:  # about 1 MB a batch: the WAL soon cannot grow
            body = b"[" + b",".join(big(i * 16 + j) for j in range(16)) + b"]"
            status = (await http.post("/v1/events", content=body, headers=BATCH)).status_code
            i += 1
        assert status == 503
        ready = await http.get("/readyz")
        assert ready.status_code == 503
        (store,) = [c for c in ready.json()["checks"] if c["name"] == "store"]
        assert not store["ok"]
        assert "commit" in store["detail"]
        assert (await http.get("/healthz")).status_code == 200


async def test_an_event_the_store_itself_refuses_is_refused_alone(store_url: str) -> None:
    """Past the bounds check (a value it missed): the store's refusal of one event ends the
    transaction, the batch is committed event by event and only that one is refused."""
    from bridge import contract
    from bridge.fleet.metrics import IngestStats
    from bridge.fleet.service import build_store
    from bridge.fleet.sources.base import Ingestor
    from bridge.fleet.store import Accepted

    now = datetime.now(UTC)
    web = gce_vm("web-1")
    good = transition(web, "g-1", Status.SCHEDULED, now, not_before=now)
    unstorable = poison(now)["spool_depth past 2^63"]  # the contract admits it
    store = build_store(store_url)
    await store.open()
    try:
        ingestor = Ingestor(store, IngestStats())
        items = [Accepted(contract.from_cloudevent(b), b) for b in (unstorable, good)]
        result = await ingestor.commit("http", items, checkpoints={"0": "2"})
        assert (result.accepted, result.invalid) == (1, 1)
        (rejected,) = await store.rejected()
        assert "cannot keep this event" in rejected["reason"]
        assert await store.checkpoints("http") == {"0": "2"}
        later = heartbeat(web, now)
        again = await ingestor.commit("http", [Accepted(contract.from_cloudevent(later), later)])
        assert again.accepted == 1
    finally:
        await store.close()


@pytest.mark.parametrize("fixed", [False, True], ids=["limit-raised", "limit-fixed"])
async def test_health_is_served_among_1100_clients_that_never_finish_their_headers(
    tmp_path: Path, fixed: bool
) -> None:
    """Raised: the service lifts its soft file limit; fixed (it cannot): each new connection
    past the cap closes the oldest one still waiting for its headers."""
    if platform.is_windows():
        pytest.skip("RLIMIT_NOFILE is POSIX")
    soft, hard = limits.file_limit()
    if hard is not None and hard < 2048:
        reason = f"the hard open-file limit ({hard}) leaves no room for 1,100 clients"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}: raise it (ulimit -Hn) on the CI runner")
        pytest.skip(reason)
    limits.set_file_limit(max(soft or 0, 2048))
    slow: list[asyncio.StreamWriter] = []
    try:
        url = f"sqlite://{tmp_path / 'f.sqlite3'}"
        async with fleet_process(tmp_path, url, files=1024, fixed_files=fixed) as http:
            port = http.base_url.port
            for _ in range(1100):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x")  # and never the rest
                slow.append(writer)
            await asyncio.gather(*(w.drain() for w in slow))
            # New connections, as a health probe and a sidecar open them.
            async with httpx.AsyncClient(base_url=http.base_url, timeout=5) as probe:
                assert (await probe.get("/healthz")).status_code == 200
            beat = heartbeat(gce_vm("web-1"), datetime.now(UTC))
            async with httpx.AsyncClient(base_url=http.base_url, timeout=5) as sidecar:
                posted = await sidecar.post("/v1/events", content=beat, headers=STRUCTURED)
                assert posted.status_code == 200
    finally:
        for writer in slow:
            writer.close()
        limits.set_file_limit(soft or 2048, hard)


async def test_a_client_that_does_not_send_its_headers_in_time_is_closed(
    fleet_service: FleetFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process, with the header timeout shortened (10 s in the service)."""
    monkeypatch.setattr(connections, "HEADER_TIMEOUT", 0.3)
    async with fleet_service() as service:
        port = int(service.url.rsplit(":", 1)[1])
        slow_reader, slow = await asyncio.open_connection("127.0.0.1", port)
        slow.write(b"GET /healthz HTTP/1.1\r\nHost: x")  # never the end of the headers
        prompt_reader, prompt = await asyncio.open_connection("127.0.0.1", port)
        prompt.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = await prompt_reader.readuntil(b"}]}")  # the whole answer
        assert first.startswith(b"HTTP/1.1 200")
        assert await asyncio.wait_for(slow_reader.read(), timeout=5) == b""  # closed
        await asyncio.sleep(0.5)  # past the timeout: the prompt client's connection stays
        prompt.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await prompt.drain()
        second = await asyncio.wait_for(prompt_reader.readuntil(b"}]}"), timeout=5)
        assert second.startswith(b"HTTP/1.1 200")
        slow.close()
        prompt.close()


async def test_an_event_the_store_refuses_over_http_is_a_400_and_the_rest_is_kept(
    tmp_path: Path,
) -> None:
    """A real SQLite store that cannot hold one event (standing in for a value the bounds
    check missed: none is known, which is the point of the check)."""
    from bridge.fleet.config import parse_fleet_config
    from bridge.fleet.service import FleetService
    from bridge.fleet.sqlite_store import SqliteStore
    from bridge.fleet.store import Batch, IngestResult, UnstorableError

    class Picky(SqliteStore):
        # Every write goes through ingest_many (one batch, or a group of concurrent posts').
        async def ingest_many(self, batches: Sequence[Batch]) -> list[IngestResult]:
            for batch in batches:
                if any(item.event.instance.name == "bad-1" for item in batch.accepted):
                    raise UnstorableError("integer out of range")
            return await super().ingest_many(batches)

    now = datetime.now(UTC)
    good, bad = heartbeat(gce_vm("web-1"), now), heartbeat(gce_vm("bad-1"), now)
    raw = {"fleet": {"listener": {"port": 0}, "sources": [{"type": "http"}]}}
    service = FleetService(parse_fleet_config(raw), store=Picky(tmp_path / "f.sqlite3"))
    async with service.running(), httpx.AsyncClient(base_url=service.url) as http:
        answer = await http.post(
            "/v1/events", content=b"[" + bad + b"," + good + b"]", headers=BATCH
        )
        assert answer.status_code == 400
        assert answer.json()["accepted"] == 1
        assert "cannot keep" in answer.json()["error"]
        (rejected,) = (await http.get("/v1/fleet/rejected")).json()["rejected"]
        assert "integer out of range" in rejected["reason"]
        assert json.loads(rejected["body"])["id"] == json.loads(bad)["id"]


async def test_readyz_is_not_ready_while_postgresql_refuses_writes(
    tmp_path: Path, postgres_url: str
) -> None:
    """Ready means the store commits: a database turned read-only still answers SELECT 1."""
    import psycopg

    def read_only(on: bool) -> None:
        with psycopg.connect(postgres_url, autocommit=True) as db:
            name = db.info.dbname
            db.execute("SET default_transaction_read_only = off")  # this session may write
            setting = "SET default_transaction_read_only = on" if on else "RESET ALL"
            db.execute(f'ALTER DATABASE "{name}" {setting}')
            db.execute(  # the fleet's connections come back with the new setting
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )

    async with fleet_process(tmp_path, postgres_url) as http:
        await asyncio.to_thread(read_only, True)

        async def not_ready() -> bool:
            answer = await http.get("/readyz")
            return answer.status_code == 503 and "read-only" in answer.text

        await eventually(not_ready, timeout=30)
        beat = heartbeat(gce_vm("web-1"), datetime.now(UTC))
        assert (await http.post("/v1/events", content=beat, headers=STRUCTURED)).status_code == 503
        await asyncio.to_thread(read_only, False)

        async def committed() -> bool:  # the sidecar's retry
            posted = await http.post("/v1/events", content=beat, headers=STRUCTURED)
            return posted.status_code == 200

        await eventually(committed, timeout=30)

        async def ready() -> bool:  # once the reader's broken connection is replaced too
            return (await http.get("/readyz")).status_code == 200

        await eventually(ready, timeout=30)
