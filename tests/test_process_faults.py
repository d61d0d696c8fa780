"""Process-level faults, on the real process (`python -m bridge run` against the simulator).

- A second bridge on the same state directory exits at once, naming the directory and the
  pid of the one that holds it (two would deliver every event, run every hook twice).
- SIGHUP is logged and ignored: the bridge goes on delivering (it used to die silently
  with status 129, which systemd's Restart=on-failure does not restart).
- SIGTERM while a hook runs ends the bridge within delivery.shutdown_timeout: the hook's
  process group is killed and its run reported `interrupted`, whatever the hook's timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bridge.simulator import Simulator
from tests.support import alive, assert_valid, azure_file_config, eventually, spawn_bridge

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.posix  # signals by name, a shell hook and `kill -0`


class BridgeProcess:
    """`maintenance-bridge run` with JSON logs collected line by line."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.logs: list[dict[str, Any]] = []
        self.other: list[str] = []
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stderr is not None
        async for raw in self.process.stderr:
            line = raw.decode().rstrip("\n")
            try:
                self.logs.append(json.loads(line))
            except ValueError:
                self.other.append(line)

    def logged(self, text: str) -> bool:
        return any(text in entry["message"] for entry in self.logs)

    async def exit_code(self, timeout: float) -> int:
        code = await asyncio.wait_for(self.process.wait(), timeout)
        await self._reader
        return code


@contextlib.asynccontextmanager
async def bridge_run(config: Path) -> AsyncIterator[BridgeProcess]:
    process = await spawn_bridge("run", "--config", str(config))
    try:
        yield BridgeProcess(process)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def write_config(tmp_path: Path, sim: Simulator, extra: str = "", shutdown: float = 10) -> Path:
    return azure_file_config(tmp_path, sim, f"[delivery]\nshutdown_timeout = {shutdown}\n{extra}")


def delivered(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "events.jsonl"
    if not path.exists():
        return []
    return [assert_valid(json.loads(line)) for line in path.read_text().splitlines()]


async def test_a_second_bridge_on_the_same_state_dir_exits_at_once_naming_the_holder(
    tmp_path: Path,
) -> None:
    async with Simulator(provider="azure") as sim:
        sim.faults.set(provider="azure", rate_limit=False)
        config = write_config(tmp_path, sim)
        async with bridge_run(config) as first:
            await eventually(lambda: first.logged("watching azure instance"), timeout=30)
            async with bridge_run(config) as second:
                code = await second.exit_code(timeout=30)
            assert first.process.returncode is None, "the first bridge must keep running"
            sim.azure.add_event(event_type="Freeze", duration=5)
            await eventually(lambda: len(delivered(tmp_path)) == 1, timeout=30)
            first.process.send_signal(signal.SIGTERM)
            assert await first.exit_code(timeout=30) == 0
    assert code == 1
    assert second.other == [
        f"maintenance-bridge: state directory {tmp_path / 'state'} is in use by another bridge "
        f"(pid {first.process.pid}); one bridge per state.dir, or every event would be "
        "delivered twice"
    ]
    assert not second.logged("watching"), "the second bridge must not have started watching"


async def test_spool_commands_work_beside_a_running_bridge(tmp_path: Path) -> None:
    async with Simulator(provider="azure") as sim:
        sim.faults.set(provider="azure", rate_limit=False)
        config = write_config(tmp_path, sim)
        async with bridge_run(config) as running:
            await eventually(lambda: running.logged("watching azure instance"), timeout=30)
            for action in ("list", "replay", "purge"):
                spool = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "bridge",
                    "spool",
                    action,
                    "--config",
                    str(config),
                    cwd=ROOT,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
                out, err = await asyncio.wait_for(spool.communicate(), 60)
                assert spool.returncode == 0, (action, out, err)
            running.process.send_signal(signal.SIGTERM)
            assert await running.exit_code(timeout=30) == 0


async def test_sighup_is_logged_and_ignored(tmp_path: Path) -> None:
    async with Simulator(provider="azure") as sim:
        sim.faults.set(provider="azure", rate_limit=False)
        async with bridge_run(write_config(tmp_path, sim)) as running:
            await eventually(lambda: running.logged("watching azure instance"), timeout=30)
            running.process.send_signal(signal.Signals["SIGHUP"])  # POSIX-only: by name
            await eventually(lambda: running.logged("received SIGHUP: ignored"), timeout=30)
            assert running.process.returncode is None
            sim.azure.add_event(event_type="Freeze", duration=5)
            await eventually(lambda: len(delivered(tmp_path)) == 1, timeout=30)
            running.process.send_signal(signal.SIGTERM)
            assert await running.exit_code(timeout=30) == 0


HOOK = """#!/bin/sh
# Ignores SIGTERM and keeps a child: only a kill of the whole group ends it.
trap '' TERM
echo $$ > "$1"
sleep 600 &
wait
sleep 600
"""


async def test_sigterm_while_a_hook_runs_ends_within_the_shutdown_timeout(
    tmp_path: Path,
) -> None:
    hook = tmp_path / "drain.sh"
    hook.write_text(HOOK)
    hook.chmod(0o755)
    pid_file = tmp_path / "hook.pid"
    shutdown = 1.0
    extra = f"""
[[hooks]]
command = ["{hook}", "{pid_file}"]
timeout = 600
"""
    async with Simulator(provider="azure") as sim:
        sim.faults.set(provider="azure", rate_limit=False)
        config = write_config(tmp_path, sim, extra, shutdown=shutdown)
        async with bridge_run(config) as running:
            sim.azure.add_event(event_type="Freeze", duration=5)
            await eventually(lambda: pid_file.exists() and pid_file.read_text().strip(), 30)
            hook_pid = int(pid_file.read_text())
            asked = time.monotonic()
            running.process.send_signal(signal.SIGTERM)
            code = await running.exit_code(timeout=60)
            took = time.monotonic() - asked
    assert code == 0
    # The hook ignores SIGTERM: before the fix the stop waited shutdown_timeout and then
    # another 5 s of kill grace. Now the kill comes at the deadline; the margin is for a
    # loaded machine (the rest of the stop: delivering the audit event, closing the spool).
    assert took < shutdown + 4.0, f"stop took {took:.1f}s"
    assert not alive(hook_pid), "the hook's process group must be gone"
    (completed,) = [e for e in delivered(tmp_path) if e["type"].endswith("hook.completed")]
    assert completed["data"]["outcome"] == "interrupted"


def test_a_state_dir_that_cannot_be_created_is_exit_2_and_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    config = tmp_path / "bridge.toml"
    config.write_text(f'[state]\ndir = "{blocker / "state"}"\n[listener]\nenabled = false\n')
    result = subprocess.run(
        [sys.executable, "-m", "bridge", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 2
    (line,) = [entry for entry in result.stderr.splitlines() if not entry.startswith("{")]
    assert line.startswith(f"maintenance-bridge: cannot use the state directory {blocker}")
