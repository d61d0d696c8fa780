"""`maintenance-bridge fleet` as a user runs it: serve (and survive kill -9), status, export."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from bridge.fleet.config import DEFAULT_STORE_URL
from bridge.fleet.sqlite_store import SqliteStore
from bridge.pipeline.model import Status
from bridge.transports import webhook_signing as signing
from tests.fleet.conftest import SECRET
from tests.fleet.factories import T0, azure_vm, batch, gce_vm, heartbeat, transition
from tests.support import eventually, free_port, running_as_root
from tests.test_cli import ROOT, bridge

pytest_plugins = ["tests.fleet.postgres_server"]
VM = azure_vm("db-1")
EVENTS = [
    heartbeat(VM, T0),
    transition(VM, "ev-1", Status.SCHEDULED, T0, not_before=T0),
    transition(gce_vm("web-1"), "g-1", Status.STARTED, T0),
]


def fleet_config(tmp_path: Path, port: int = 0, secret: bool = False) -> Path:
    source = f'\n[[fleet.sources]]\ntype = "http"\nsecrets = ["{SECRET}"]\n' if secret else ""
    path = tmp_path / "fleet.toml"
    path.write_text(
        f'[fleet.listener]\nport = {port}\n[fleet.store]\nurl = "sqlite://{tmp_path}/fleet.db"\n'
        + source
    )
    return path


async def _fill(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "fleet.db")
    await store.open()
    await store.ingest(batch(*EVENTS))
    await store.close()


async def test_status_prints_the_summary_as_tables(tmp_path: Path) -> None:
    await _fill(tmp_path)
    done = bridge("fleet", "status", "--config", str(fleet_config(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert "instances by provider" in done.stdout
    lines = [line.split() for line in done.stdout.splitlines()]
    assert ["azure", "1"] in lines
    assert ["notices_in_force", "2"] in lines
    assert "instances by attestation" in done.stdout  # a fleet checking no identity:
    assert ["unchecked", str(len({json.loads(e)["source"] for e in EVENTS}))] in lines


async def test_export_writes_every_event_as_received_in_jsonl_and_csv(tmp_path: Path) -> None:
    await _fill(tmp_path)
    config = str(fleet_config(tmp_path))
    jsonl = bridge("fleet", "export", "--config", config)
    assert jsonl.returncode == 0, jsonl.stderr
    rows = [json.loads(line) for line in jsonl.stdout.splitlines()]
    assert [row["event"] for row in rows] == [json.loads(e) for e in EVENTS]
    assert {row["ingest"] for row in rows} == {"http"}
    table = bridge("fleet", "export", "--config", config, "--format", "csv", "--instance", "db-1")
    parsed = list(csv.reader(io.StringIO(table.stdout)))
    assert parsed[0][:6] == ["seq", "received_at", "ingest", "source", "id", "type"]
    assert [row[5] for row in parsed[1:]] == [
        "io.maintenancebridge.agent.heartbeat",
        "io.maintenancebridge.maintenance.scheduled",
    ]
    later = bridge("fleet", "export", "--config", config, "--since", "2030-01-01T00:00:00Z")
    assert (later.returncode, later.stdout) == (0, "")
    bad = bridge("fleet", "export", "--config", config, "--since", "last week")
    assert bad.returncode == 1
    assert "--since" in bad.stderr


def test_export_refuses_an_unknown_type_listing_the_known_ones(tmp_path: Path) -> None:
    config = str(fleet_config(tmp_path))
    done = bridge("fleet", "export", "--config", config, "--type", "maintenance.scheduled")
    assert (done.returncode, done.stdout) == (1, "")
    assert "--type: unknown event type 'maintenance.scheduled'" in done.stderr
    assert "io.maintenancebridge.maintenance.scheduled" in done.stderr
    assert "io.maintenancebridge.agent.heartbeat" in done.stderr
    assert not (tmp_path / "fleet.db").exists()


def test_read_commands_never_create_a_store(tmp_path: Path) -> None:
    """A mistyped `[fleet.store] url`: an error naming the path, and nothing created."""
    config = tmp_path / "fleet.toml"
    missing = tmp_path / "no-such-dir" / "fleet.db"
    config.write_text(f'[fleet.store]\nurl = "sqlite://{missing}"\n')
    for action in ("status", "export"):
        done = bridge("fleet", action, "--config", str(config))
        assert done.returncode == 1, (action, done.stdout)
        assert f"no fleet store at {missing}" in done.stderr
        assert "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.toml"]
    # A file that is there but is no fleet store (a wrong file named) is read, not changed.
    other = tmp_path / "notes.db"
    other.write_bytes(b"")
    config.write_text(f'[fleet.store]\nurl = "sqlite://{other}"\n')
    done = bridge("fleet", "status", "--config", str(config))
    assert done.returncode == 1
    assert f"{other} is not a fleet store" in done.stderr
    assert other.read_bytes() == b""


def test_read_commands_never_create_tables_in_postgresql(postgres_url: str, tmp_path: Path) -> None:
    """An empty PostgreSQL database (the wrong one named) stays empty."""
    import psycopg

    config = tmp_path / "fleet.toml"
    config.write_text(f'[fleet.store]\nurl = "{postgres_url}"\n')
    done = bridge("fleet", "status", "--config", str(config))
    assert done.returncode == 1
    assert "no fleet store in postgresql://" in done.stderr
    with psycopg.connect(postgres_url) as db:
        tables = db.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()
    assert tables == (0,)


def test_status_without_a_configuration_names_the_default_store() -> None:
    """No configuration: the default path, reported missing and left uncreated. As root with
    `unshare`, under an empty private /var/lib (this machine's own state neither matters
    nor changes); elsewhere only where that directory does not exist."""
    default = Path(DEFAULT_STORE_URL.removeprefix("sqlite://"))
    assert default.parts[:3] == ("/", "var", "lib")
    if running_as_root() and shutil.which("unshare"):
        script = (
            "mount -t tmpfs none /var/lib || exit 99; "
            f"{shlex.quote(sys.executable)} -m bridge fleet status; "
            'echo "exit=$?"; ls -A /var/lib'
        )
        done = subprocess.run(
            ["unshare", "--mount", "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
            check=False,
        )
        if done.returncode == 99:
            pytest.skip(f"no private mount here: {done.stderr.strip()}")
        assert done.stdout.splitlines() == ["exit=1"]  # and /var/lib still empty
    elif default.parent.exists():
        pytest.skip(f"{default.parent} exists here: a fleet service may use it")
    else:
        done = bridge("fleet", "status")
        assert done.returncode == 1
        assert not default.parent.exists()
    assert f"no fleet store at {default}" in done.stderr


async def test_status_reads_a_store_beside_the_running_service(tmp_path: Path) -> None:
    """Read-only opening still sees what the service committed (WAL) and changes nothing."""
    await _fill(tmp_path)
    store = SqliteStore(tmp_path / "fleet.db")
    await store.open()  # the service's writer, holding the file open
    try:
        done = bridge("fleet", "export", "--config", str(fleet_config(tmp_path)))
        assert done.returncode == 0, done.stderr
        assert len(done.stdout.splitlines()) == len(EVENTS)
        await store.ingest(batch(heartbeat(VM, T0 + timedelta(minutes=1), sequence=1)))
        again = bridge("fleet", "export", "--config", str(fleet_config(tmp_path)))
        assert len(again.stdout.splitlines()) == len(EVENTS) + 1
    finally:
        await store.close()


def test_a_bad_fleet_configuration_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text('[fleet.listener]\nport = "high"\n[[fleet.sources]]\ntype = "carrier-pigeon"\n')
    done = bridge("fleet", "status", "--config", str(path))
    assert done.returncode == 2
    assert "fleet.listener.port" in done.stderr
    assert "fleet.sources[0].type" in done.stderr


@asynccontextmanager
async def serving(config: Path, port: int) -> AsyncIterator[asyncio.subprocess.Process]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge",
        "fleet",
        "--config",
        str(config),
        cwd=ROOT,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:

            async def ready() -> bool:
                try:
                    return (await http.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(ready, timeout=30)
        yield process
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_the_service_survives_kill_9_and_a_replay_doubles_nothing(tmp_path: Path) -> None:
    port = free_port()
    config = fleet_config(tmp_path, port, secret=True)
    body = b"[" + b",".join(EVENTS) + b"]"

    async def post(http: httpx.AsyncClient) -> httpx.Response:
        headers = signing.standard_headers(
            "batch-1", int(time.time()), body, [signing.standard_key(SECRET)]
        )
        headers["content-type"] = "application/cloudevents-batch+json"
        return await http.post("/v1/events", content=body, headers=headers)

    url = f"http://127.0.0.1:{port}"
    async with serving(config, port) as process, httpx.AsyncClient(base_url=url) as http:
        assert (await post(http)).json() == {"accepted": 3, "duplicate": 0, "invalid": 0}
        process.kill()  # SIGKILL: no chance to finish anything
        await process.wait()
    async with serving(config, port) as process, httpx.AsyncClient(base_url=url) as http:
        assert (await post(http)).json() == {"accepted": 0, "duplicate": 3, "invalid": 0}
        notices = (await http.get("/v1/fleet/notices")).json()
        assert sorted(n["notice_id"] for n in notices["notices"]) == ["ev-1", "g-1"]
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 15) == 0
