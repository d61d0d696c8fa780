"""Faults of the spool and of a watcher: no storms, no tracebacks, and health that says so.

Real parts only: the bridge's own SQLite spool, a second SQLite connection holding the
write lock (what another writer or a stuck disk does to us), `maintenance-bridge spool
replay` run as a separate process, and the simulator over HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import httpx
import pytest
from cloudevents.core.v1.event import CloudEvent

from bridge.pipeline.spool import DB_NAME, Spool
from bridge.pipeline.watchers.base import Update
from bridge.providers.gce import watcher as gce
from bridge.runner import Bridge
from bridge.simulator import Simulator
from bridge.sinkapi import Reject, Result
from bridge.surface.health import HealthMonitor
from tests.support import (
    CheckedSink,
    bridge_config,
    bridge_process,
    eventually,
    free_port,
    running_bridge,
)
from tests.test_cli import bridge


def check(monitor: HealthMonitor, name: str, *, live: bool = False) -> tuple[bool, str]:
    checks = monitor.liveness() if live else monitor.readiness()
    (found,) = [c for c in checks if c.name == name]
    return found.ok, found.detail


async def test_a_replay_from_another_process_is_delivered_without_a_restart(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    sink = CheckedSink("memory")
    sink.fail_next(Reject("HTTP 400 from receiver"))
    config = tmp_path / "bridge.toml"
    config.write_text(f'[state]\ndir = "{tmp_path}"\n[[sinks]]\ntype = "stdout"\nname = "memory"\n')
    async with running_bridge(gce_sim, tmp_path, sink=sink) as run:
        await run.settle(0.3)
        gce_sim.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
        await eventually(lambda: run.bridge.dispatcher.stats["memory"].dead_lettered == 1)
        assert sink.events == []

        replayed = await asyncio.to_thread(bridge, "spool", "replay", "--config", str(config))
        assert "replayed 1 event(s)" in replayed.stdout, replayed.stderr
        await sink.wait_for(1, timeout=10)  # no wake-up from the other process: noticed alone
    assert run.sink.summary() == [("live-migrate", "started")]


class LockingSink(CheckedSink):
    """Accepts events; the first delivery also makes the spool unwritable (another writer
    takes its lock), as a disk that fills just as the sink recovers."""

    def __init__(self, name: str, spool_path: Path) -> None:
        super().__init__(name)
        self.blocker = sqlite3.connect(spool_path, isolation_level=None)
        self.locked = False

    async def _publish(self, batch: Sequence[CloudEvent]) -> Result:
        result = await super()._publish(batch)
        if not self.locked:
            self.blocker.execute("BEGIN IMMEDIATE")
            self.locked = True
        return result

    def unlock(self) -> None:
        self.blocker.rollback()
        self.blocker.close()


async def test_acknowledgements_that_cannot_be_written_are_retried_not_resent(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    sink = LockingSink("memory", tmp_path / DB_NAME)
    async with running_bridge(gce_sim, tmp_path, sink=sink) as run:
        await run.settle(0.3)
        await run.bridge.spool._run(lambda db: db.execute("PRAGMA busy_timeout=50"))
        monitor = HealthMonitor()
        monitor.attach(run.bridge)
        gce_sim.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
        await run.wait_for(1)
        await eventually(lambda: not check(monitor, "spool")[0])
        assert "database is locked" in check(monitor, "spool")[1]
        assert check(monitor, "spool", live=True)[0]  # not yet a reason to restart
        await asyncio.sleep(6.0)  # longer than the old fixed 5 s pause that re-sent the window
        sink.unlock()
        await eventually(lambda: check(monitor, "spool")[0])
        assert (await run.settle()) == run.sink.dicts()
        assert await run.bridge.spool.depth() == {}  # acknowledged in the end
    assert run.sink.summary() == [("live-migrate", "started")]
    assert run.sink.attempts == 1  # sent once, however long its acknowledgement waited


async def test_a_spool_that_stays_unwritable_fails_liveness_after_the_set_time(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    settings = {"delivery": {"spool_failure_timeout": 0.5}}
    async with running_bridge(gce_sim, tmp_path, settings=settings) as run:
        await run.settle(0.3)
        monitor = HealthMonitor()
        monitor.attach(run.bridge)
        await run.bridge.spool._run(lambda db: db.execute("PRAGMA busy_timeout=50"))
        blocker = sqlite3.connect(tmp_path / DB_NAME, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            gce_sim.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
            await eventually(lambda: not check(monitor, "spool", live=True)[0])
            assert "writes failing" in check(monitor, "spool", live=True)[1]
        finally:
            blocker.rollback()
            blocker.close()
        await run.wait_for(1)  # the notice waited in the watcher, and goes out now
        await eventually(lambda: check(monitor, "spool", live=True)[0])


class _Exploding(gce.GceWatcher):
    """A watcher with a bug (mocked: the parsers no longer let input provoke one)."""

    async def watch(self) -> AsyncIterator[Update]:
        await self.identify()
        raise RuntimeError("a bug in the watcher")
        yield  # pragma: no cover


async def test_a_crash_looping_watcher_is_not_ready(gce_sim: Simulator, tmp_path: Path) -> None:
    config = bridge_config(gce_sim, tmp_path)

    def build(checkpoint: dict[str, object] | None) -> _Exploding:
        source = config.source.gce
        return _Exploding(gce.new_client(source, retry_initial=0.01, retry_max=0.05), source)

    sink = CheckedSink("memory")
    crashing = Bridge(config, {"gce": build}, [sink], Spool(tmp_path, [sink.name]))
    monitor = HealthMonitor()
    monitor.attach(crashing)
    stop = asyncio.Event()
    task = asyncio.create_task(crashing.run(stop))
    try:
        await eventually(lambda: "watcher:gce" in {c.name for c in monitor.readiness()})
        ok, detail = check(monitor, "watcher:gce")
        assert not ok
        assert "RuntimeError: a bug in the watcher" in detail
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_readiness_names_the_gce_key_that_fails(gce_sim: Simulator, tmp_path: Path) -> None:
    async with running_bridge(gce_sim, tmp_path) as run:
        monitor = HealthMonitor()
        monitor.attach(run.bridge)
        await eventually(lambda: all(c.ok for c in monitor.readiness()))
        names = [c.name for c in monitor.readiness() if c.name.startswith("metadata:gce")]
        assert names == [
            "metadata:gce",
            "metadata:gce:instance/maintenance-event",
            "metadata:gce:instance/preempted",
            "metadata:gce:instance/upcoming-maintenance",
        ]
        # upcoming-maintenance is polled (nothing scheduled); the flags wait in long polls.
        gce_sim.faults.set(provider="gce", malformed=1_000_000)
        upcoming = "metadata:gce:instance/upcoming-maintenance"
        await eventually(lambda: not check(monitor, upcoming)[0])
        assert "malformed" in check(monitor, upcoming)[1]
        gce_sim.faults.clear(provider="gce")
        await eventually(lambda: check(monitor, upcoming)[0])


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_spool_at_start_is_one_line_and_exit_2(tmp_path: Path, damage: str) -> None:
    spool = tmp_path / DB_NAME
    db = sqlite3.connect(spool)
    db.execute("CREATE TABLE t (x)")
    db.executemany("INSERT INTO t VALUES (?)", [("x" * 1000,) for _ in range(200)])
    db.commit()
    db.close()
    if damage == "garbage":
        spool.write_bytes(os.urandom(8192))
    else:
        with spool.open("r+b") as file:
            file.truncate(3 * 4096)
    config = tmp_path / "bridge.toml"
    config.write_text(f'[state]\ndir = "{tmp_path}"\n')
    result = bridge("spool", "list", "--config", str(config))
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert str(spool) in line
    assert "move it aside" in line


async def test_health_of_the_real_process_while_its_spool_cannot_be_written(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    port = free_port()
    out = tmp_path / "events.jsonl"
    config = tmp_path / "bridge.toml"
    settings = (
        f"[delivery]\nspool_failure_timeout = 2.0\n[listener]\nport = {port}\n"
        "[heartbeat]\ninterval = 0\n"  # the file gets the one notice and nothing else
    )
    config.write_text(
        f'[source.gce]\nmetadata_url = "{gce_sim.gce_url}"\n[source]\nprovider = "gce"\n'
        f'[state]\ndir = "{tmp_path}"\n{settings}[[sinks]]\ntype = "file"\npath = "{out}"\n'
    )
    process = await bridge_process("run", "--config", str(config))
    blocker = sqlite3.connect(tmp_path / DB_NAME, isolation_level=None)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:

            async def status(path: str, code: int) -> bool:
                with contextlib.suppress(httpx.TransportError):
                    return (await client.get(path)).status_code == code
                return False

            await eventually(lambda: status("/readyz", 200), timeout=20)
            blocker.execute("BEGIN IMMEDIATE")  # another writer holds the spool's lock
            gce_sim.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
            await eventually(lambda: status("/readyz", 503), timeout=20)
            (spool,) = [
                c for c in (await client.get("/readyz")).json()["checks"] if c["name"] == "spool"
            ]
            assert "writes failing" in spool["detail"]
            assert "database is locked" in spool["detail"]
            await eventually(lambda: status("/healthz", 503), timeout=20)  # for > 2 s
            blocker.rollback()
            await eventually(lambda: status("/healthz", 200), timeout=20)
            await eventually(lambda: status("/readyz", 200), timeout=20)
            await eventually(lambda: out.exists() and out.read_text().count("\n") == 1)
    finally:
        blocker.close()
        process.terminate()
        await asyncio.wait_for(process.wait(), 20)
