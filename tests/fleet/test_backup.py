"""`fleet backup PATH` copies a live SQLite store while it ingests, and `fleet restore PATH`
puts the copy back, but never under a running service.

Real parts throughout: the fleet service on a real listener and SQLite store, events posted
over HTTP, and the two commands run as the real CLI in child processes (the way an operator
runs them beside the service).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sqlite3
import sys
from pathlib import Path

import httpx
import pytest

from bridge.fleet.backup import BackupError, backup, restore
from bridge.infra import platform
from bridge.pipeline.model import Status
from tests.fleet.conftest import FleetFactory
from tests.fleet.factories import T0, gce_vm, transition
from tests.support import running_as_root

ROOT = Path(__file__).resolve().parents[2]
BATCH = {"content-type": "application/cloudevents-batch+json"}


async def fleet_cli(config: Path, *argv: str) -> tuple[int, str, str]:
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bridge", "fleet", "--config", str(config), *argv,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await child.communicate()
    assert child.returncode is not None
    return child.returncode, out.decode(), err.decode()


def store_config(path: Path, store: Path) -> Path:
    path.write_text(f'[fleet.store]\nurl = "sqlite://{store}"\n')
    return path


def event_ids(store: Path) -> set[str]:
    with sqlite3.connect(store) as db:
        return {row[0] for row in db.execute("SELECT id FROM events")}


async def test_a_backup_taken_during_ingest_restores_every_acknowledged_event(
    fleet_service: FleetFactory, tmp_path: Path
) -> None:
    live = tmp_path / "fleet.sqlite3"  # the fixture's store
    copy = tmp_path / "backup" / "fleet-backup.sqlite3"
    copy.parent.mkdir()
    acknowledged: list[str] = []
    stop = asyncio.Event()
    enough = asyncio.Event()  # a few hundred events in the store before the backup

    async def ingest(url: str) -> None:
        async with httpx.AsyncClient(base_url=url) as client:
            batch = 0
            while not stop.is_set():
                bodies = [
                    transition(gce_vm(f"vm-{batch}"), f"n-{batch}-{i}", Status.SCHEDULED, T0)
                    for i in range(20)
                ]
                answer = await client.post(
                    "/v1/events", content=b"[" + b",".join(bodies) + b"]", headers=BATCH
                )
                assert answer.is_success, answer.text
                acknowledged.extend(json.loads(body)["id"] for body in bodies)
                if len(acknowledged) >= 200:
                    enough.set()
                batch += 1

    async with fleet_service() as service:
        poster = asyncio.create_task(ingest(service.url))
        await asyncio.wait_for(enough.wait(), 30)
        before = set(acknowledged)  # acknowledged before the backup began
        code, out, err = await fleet_cli(
            store_config(tmp_path / "fleet.toml", live), "backup", str(copy)
        )
        during = len(acknowledged) - len(before)
        stop.set()
        await poster
        assert code == 0, err
        assert f"backed up {live} to {copy}" in out
        # Restoring over the running service's store is refused, and changes nothing.
        code, _, err = await fleet_cli(tmp_path / "fleet.toml", "restore", str(copy))
        assert code == 1
        assert "in use" in err
        assert "stop the service" in err
        assert event_ids(live) >= set(acknowledged)
    assert during > 0, "ingest went on while the backup ran"
    assert not list(copy.parent.glob("*-wal"))  # one self-contained file

    restored = tmp_path / "restored" / "fleet.sqlite3"
    restored.parent.mkdir()
    if not platform.is_windows() and running_as_root():
        # as under systemd: the directory belongs to the service's user
        shutil.chown(restored.parent, 65534, 65534)
    config = store_config(tmp_path / "restored.toml", restored)
    code, out, err = await fleet_cli(config, "restore", str(copy))
    assert code == 0, err
    # One file, no -wal or -shm left behind (the service creates its own, as its own user),
    # owned like its directory.
    assert [p.name for p in restored.parent.iterdir()] == [restored.name]
    assert restored.stat().st_uid == restored.parent.stat().st_uid
    found = event_ids(restored)
    assert before <= found  # every event acknowledged before the backup
    assert found <= set(acknowledged)  # and nothing that was never sent
    code, out, err = await fleet_cli(config, "status")
    assert code == 0, err


def test_backup_and_restore_refuse_with_a_reason(tmp_path: Path) -> None:
    store = tmp_path / "fleet.sqlite3"
    with sqlite3.connect(store) as db:
        db.execute("CREATE TABLE events (id TEXT)")
    taken = tmp_path / "taken.sqlite3"
    taken.write_text("not mine to overwrite")
    for call, message in (
        (lambda: backup(tmp_path / "missing.sqlite3", tmp_path / "x"), "no fleet store at"),
        (lambda: backup(store, taken), "exists: back up to a new path"),
        (lambda: restore(tmp_path / "missing", store), "no backup at"),
        (lambda: restore(taken, store), "is not a fleet store backup"),
    ):
        with pytest.raises(BackupError, match=re.escape(message)):
            call()
    assert taken.read_text() == "not mine to overwrite"


async def test_a_postgresql_store_is_sent_to_pg_dump(tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text('[fleet.store]\nurl = "postgresql://fleet@127.0.0.1:9/fleet"\n')
    code, _, err = await fleet_cli(config, "backup", str(tmp_path / "copy"))
    assert code == 1
    assert "pg_dump" in err
    assert not (tmp_path / "copy").exists()
