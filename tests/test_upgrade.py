"""Upgrades and rollbacks across releases, pinned with the state of the earliest build.

`tests/fixtures/upgrade/` holds state directories written by the earliest commit of the
history built as a release (its README says how they were made): spools with events
delivered to one sink (`archive`, a file sink) and still pending for another (`fleet`, a
webhook whose receiver was down), and the watchers' checkpoints. Today's bridge takes such a
directory over and delivers what was pending, once, under the original ids, to a real fleet
service; nothing already delivered goes out again. From 0.2.0 on the spool names its format
and the release that last opened it, and a release refuses a spool of a newer format with a
line naming the release that wrote it (an older build cannot learn that rule; what it does
is in docs/operations.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridge import contract
from bridge.compose import compose
from bridge.fleet.config import parse_fleet_config
from bridge.fleet.service import FleetService
from bridge.infra.buildinfo import version
from bridge.pipeline.spool import DB_NAME, FORMAT, Spool, SpoolError, written_by
from bridge.simulator import Simulator
from tests.support import FAST_RETRY, bridge_config, eventually

FIXTURES = Path(__file__).parent / "fixtures" / "upgrade"
PROVIDERS = ("gce", "azure")


def _rows(spool: Path, query: str) -> list[tuple[Any, ...]]:
    """Rows of a spool opened read-only; a fixture as immutable too, so that reading it
    leaves no -wal or -shm file beside it."""
    fixed = "&immutable=1" if spool.is_relative_to(FIXTURES) else ""
    db = sqlite3.connect(f"{spool.resolve().as_uri()}?mode=ro{fixed}", uri=True)
    try:
        return db.execute(query).fetchall()
    finally:
        db.close()


def pending_ids(spool: Path, sink: str) -> list[str]:
    return [
        row[0]
        for row in _rows(
            spool,
            "SELECT e.id FROM pending p JOIN events e ON e.seq = p.seq "  # noqa: S608
            f"WHERE p.sink = '{sink}' ORDER BY e.seq",
        )
    ]


def test_the_fixtures_hold_undelivered_events_and_checkpoints() -> None:
    for provider in PROVIDERS:
        spool = FIXTURES / provider / "state" / DB_NAME
        assert pending_ids(spool, "fleet"), provider  # waiting for the webhook
        assert not pending_ids(spool, "archive"), provider  # the file sink got them all
        assert _rows(spool, "SELECT name FROM watcher_state") == [(provider,)]
        assert _rows(spool, "PRAGMA user_version") == [(0,)]  # before 0.2.0: no format


def _fleet(tmp_path: Path) -> FleetService:
    raw = {
        "fleet": {
            "listener": {"port": 0},
            "store": {"url": f"sqlite://{tmp_path / 'fleet.sqlite3'}"},
            "sources": [{"type": "http"}],
        }
    }
    return FleetService(parse_fleet_config(raw))


async def _audit_ids(http: httpx.AsyncClient) -> list[str]:
    answer = await http.get("/v1/fleet/events?limit=500")
    return [event["id"] for event in answer.json()]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_todays_bridge_delivers_the_earliest_builds_spool_once_under_its_ids(
    provider: str, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    shutil.copytree(FIXTURES / provider / "state", state)
    spooled = pending_ids(state / DB_NAME, "fleet")
    archive = tmp_path / "archive.jsonl"
    service = _fleet(tmp_path)
    async with (
        Simulator(provider) as sim,  # the same simulated VM, nothing in force any more
        service.running(),
        httpx.AsyncClient(base_url=service.url) as http,
    ):
        sinks = [
            {"type": "webhook", "name": "fleet", "url": f"{service.url}/v1/events"},
            {"type": "file", "name": "archive", "path": str(archive)},
        ]
        config = bridge_config(sim, state, {"sinks": sinks})
        bridge = compose(config, [provider], None, **FAST_RETRY)  # type: ignore[list-item]
        stop = asyncio.Event()
        task = asyncio.create_task(bridge.run(stop))
        try:
            await eventually(lambda: _eq(_audit_ids(http), spooled), timeout=20)
            await eventually(lambda: bool(bridge.watchers), timeout=10)
            await asyncio.sleep(1.0)  # the watcher reads its old checkpoint: nothing new
            assert await _audit_ids(http) == spooled  # once each, in order, original ids
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
    assert not archive.exists()  # what the archive had is not sent again
    assert pending_ids(state / DB_NAME, "fleet") == []
    assert _rows(state / DB_NAME, "PRAGMA user_version") == [(FORMAT,)]
    assert _rows(state / DB_NAME, "SELECT value FROM meta") == [(version(),)]


async def _eq(answer: Any, expected: Any) -> bool:
    return bool(await answer == expected)


def _columns(spool: Path) -> dict[str, list[tuple[str, str]]]:
    tables = [
        row[0]
        for row in _rows(spool, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
    ]
    return {
        table: [(row[1], row[2]) for row in _rows(spool, f"PRAGMA table_info({table})")]
        for table in tables
    }


def test_a_rollback_finds_every_table_and_column_the_earliest_build_reads(tmp_path: Path) -> None:
    """Today's spool keeps the earliest build's tables and columns as they were (it only
    adds tables), which is why the earliest build, rolled back to, delivers what today's
    spooled (measured by hand with that build: tests/fixtures/upgrade/README.md)."""
    spool = Spool(tmp_path, ["fleet"])
    spool.open_sync()
    today = _columns(tmp_path / DB_NAME)
    for table, columns in _columns(FIXTURES / "gce" / "state" / DB_NAME).items():
        assert today[table] == columns, table


def _future_spool(tmp_path: Path, format_: int, writer: str) -> Path:
    state = tmp_path / "state"
    shutil.copytree(FIXTURES / "gce" / "state", state)
    db = sqlite3.connect(state / DB_NAME)
    db.execute(f"PRAGMA user_version = {int(format_)}")
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute("INSERT INTO meta VALUES ('written_by', ?)", (writer,))
    db.commit()
    db.close()
    return state


def test_a_spool_of_a_newer_format_is_refused_naming_its_release(tmp_path: Path) -> None:
    state = _future_spool(tmp_path, FORMAT + 1, "9.1.0+gfeedbee")
    before = hashlib.sha256((state / DB_NAME).read_bytes()).hexdigest()
    spool = Spool(state, ["fleet"])
    with pytest.raises(SpoolError) as refused:
        spool.open_sync()
    message = str(refused.value)
    assert "written by maintenance-bridge 9.1.0+gfeedbee" in message
    assert f"spool format {FORMAT + 1}" in message
    assert version() in message
    assert hashlib.sha256((state / DB_NAME).read_bytes()).hexdigest() == before


def test_run_refuses_a_newer_spool_with_one_line_and_the_no_restart_status(
    tmp_path: Path,
) -> None:
    state = _future_spool(tmp_path, FORMAT + 1, "9.1.0")
    config = tmp_path / "bridge.toml"
    config.write_text(
        f'[source]\nprovider = "gce"\n[source.gce]\nmetadata_url = "http://127.0.0.1:9/"\n'
        f'[state]\ndir = "{state}"\n[listener]\nenabled = false\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "bridge", "spool", "list", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr  # systemd's RestartPreventExitStatus
    lines = [line for line in done.stderr.splitlines() if "9.1.0" in line]
    assert len(lines) == 1, done.stderr
    assert "written by maintenance-bridge 9.1.0" in lines[0]


def test_a_newer_release_of_the_same_format_is_named_and_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = _future_spool(tmp_path, FORMAT, "9.1.0")
    spool = Spool(state, ["fleet"])
    with caplog.at_level(logging.WARNING, "bridge.spool"):
        spool.open_sync()
    assert "last opened by maintenance-bridge 9.1.0, newer than this" in caplog.text
    db = sqlite3.connect(state / DB_NAME)
    assert written_by(db) == version()
    db.close()


def test_the_earliest_builds_events_validate_against_todays_contract() -> None:
    for provider in PROVIDERS:
        for line in (FIXTURES / provider / "delivered.jsonl").read_text().splitlines():
            event = contract.from_cloudevent(json.loads(line))
            assert event.data is not None
