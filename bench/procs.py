"""Processes of a benchmark run: the bridge, the vendors' samples and the receiver.

Every measured program is its own process, as it is on a VM: RSS, CPU time and start-up are
properties of a process, and the bridge must not share an event loop or a GIL with the
simulator or the receiver that time it. Times that cross processes are `time.monotonic()`,
which on Linux is one clock for the whole host (CLOCK_MONOTONIC).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bridge.simulator import Simulator

ROOT = Path(__file__).resolve().parent.parent


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def to_toml(config: Mapping[str, Any]) -> str:
    """The bridge's configuration as TOML (tables, `[[sinks]]`, scalars: all it needs)."""
    lines: list[str] = []

    def table(prefix: str, values: Mapping[str, Any]) -> None:
        scalars = {k: v for k, v in values.items() if not isinstance(v, Mapping | list)}
        if prefix:
            lines.append(f"[{prefix}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in scalars.items())
        for key, value in values.items():
            name = f"{prefix}.{key}" if prefix else key
            if isinstance(value, Mapping):
                table(name, value)
            elif isinstance(value, list):
                for item in value:
                    lines.append(f"[[{name}]]")
                    lines.extend(f"{k} = {_toml_value(v)}" for k, v in item.items())

    table("", config)
    return "\n".join(lines) + "\n"


def bridge_config(
    workdir: Path,
    provider: str,
    sinks: list[dict[str, Any]],
    *,
    gce_url: str,
    azure_url: str,
    aws_url: str | None = None,
) -> dict[str, Any]:
    aws = {} if aws_url is None else {"aws": {"imds_url": aws_url}}
    return {
        "source": {
            "provider": provider,
            "gce": {"metadata_url": gce_url},
            "azure": {"imds_url": azure_url, "first_call_timeout": 10.0},
            **aws,
        },
        "state": {"dir": str(workdir / "state")},
        "delivery": {"shutdown_timeout": 2.0},
        # The listener runs as in production (it is on by default), on a free port so that
        # several bridges can run side by side.
        "listener": {"port": 0},
        # Heartbeats off: the receivers time notices, and count every event they get.
        "heartbeat": {"interval": 0},
        "sinks": sinks,
    }


def webhook(url: str, mode: str = "structured") -> dict[str, Any]:
    return {"type": "webhook", "url": url, "mode": mode}


#: A Pub/Sub and an Event Hubs sink that only point at loopback: configured, never used
#: while idle (nothing to send), so they cost what their clients cost to hold, no traffic.
CLOUD_SINKS: dict[str, dict[str, Any]] = {
    "pubsub": {
        "type": "pubsub",
        "topic": "projects/bench-project/topics/maintenance",
        "endpoint": "127.0.0.1:9",
    },
    "eventhubs": {
        "type": "eventhubs",
        "connection_string": "Endpoint=sb://127.0.0.1/;SharedAccessKeyName=bench;"
        "SharedAccessKey=YmVuY2g=;EntityPath=maintenance",
    },
}


@dataclass
class Proc:
    """One child process, its log file, and the lines it printed (timestamped by it)."""

    name: str
    process: asyncio.subprocess.Process
    log: Path
    lines: list[tuple[float, str]] = field(default_factory=list)
    _reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def ps(self) -> psutil.Process:
        return psutil.Process(self.pid)

    def cpu_seconds(self) -> float:
        times = self.ps().cpu_times()
        return float(times.user + times.system)

    def peak_rss_mb(self) -> float:
        return peak_rss_mb(self.pid)

    async def stop(self, timeout: float = 10.0) -> int | None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), timeout)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        return self.process.returncode


def peak_rss_mb(pid: int) -> float:
    """Peak resident set size (VmHWM) in MiB; the current RSS where /proc has no VmHWM."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float(psutil.Process(pid).memory_info().rss) / 2**20


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAINTENANCE_BRIDGE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("PUBSUB_EMULATOR_HOST", None)
    env.pop("GCE_METADATA_HOST", None)
    env.update(extra or {})
    return env


async def spawn(name: str, args: list[str], workdir: Path, *, stamped_stdout: bool = False) -> Proc:
    """Start `python args...`; with `stamped_stdout`, collect its "<monotonic> <text>" lines."""
    log = workdir / f"{name}.log"
    with log.open("wb") as err:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if stamped_stdout else subprocess.DEVNULL,
            stderr=err,
            env=child_env(),
            cwd=workdir,
        )
    proc = Proc(name, process, log)
    if stamped_stdout:
        proc._reader = asyncio.create_task(_read_stamped(proc))
    return proc


async def _read_stamped(proc: Proc) -> None:
    stream = proc.process.stdout
    assert stream is not None
    async for raw in stream:
        stamp, _, text = raw.decode(errors="replace").rstrip("\n").partition(" ")
        with contextlib.suppress(ValueError):
            proc.lines.append((float(stamp), text))


async def start_bridge(
    name: str, workdir: Path, config: Mapping[str, Any], spans: Path | None = None
) -> Proc:
    """`maintenance-bridge run --config` as its own process, logging JSON lines to a file.

    With `spans`, the steps of each notice's way are timed into that file (`bench.spans`).
    """
    directory = workdir / name
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.toml"
    path.write_text(to_toml(config))
    command = ["-m", "bridge", "--log-format", "json", "run", "--config", str(path)]
    if spans is not None:
        command = ["-m", "bench.spans", str(spans), *command]
    return await spawn(name, command, directory)


@contextlib.asynccontextmanager
async def simulators_running(sims: Mapping[str, Simulator]) -> AsyncIterator[None]:
    """Start every simulator of `sims`; stop each one started, however the benchmark ends."""
    started: list[Simulator] = []
    try:
        for sim in sims.values():
            await sim.start()
            started.append(sim)
        yield
    finally:
        for sim in started:
            await sim.stop()


@contextlib.contextmanager
def stopped_on_exit(procs: list[Proc]) -> Iterator[list[Proc]]:
    """Kill what is still running when a benchmark fails half-way (no stray processes)."""
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.process.kill()


def commit() -> str:
    """The checkout's commit, for a report to name what it measured; marked when the code
    measured (`bridge/`, `sinks/`) differs from it."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "bridge", "sinks")
    return f"{head}{' with uncommitted changes to bridge/ or sinks/' if dirty else ''}"
