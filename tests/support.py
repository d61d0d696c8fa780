"""Test helpers: a schema-checking sink and a harness that runs the real bridge pipeline.

Nothing here is mocked: the harness runs `Bridge` (watchers, SQLite spool, dispatcher)
against the in-process simulator, and the sink is the project's official `MemorySink`,
which additionally validates every event it receives against the published JSON Schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import psutil
from cloudevents.core.v1.event import CloudEvent

from bridge import contract
from bridge.compose import compose
from bridge.config import Config, parse_config
from bridge.pipeline.events import EVENT_TYPES, as_dict, schema
from bridge.providers.azure.simulated.group import AzureGroup
from bridge.runner import Bridge, ProviderName
from bridge.simulator import Simulator, SimulatorThread
from bridge.sinkapi import Result
from sinks.memory import MemorySink

REPOSITORY = Path(__file__).resolve().parent.parent
FAST_RETRY: dict[str, Any] = {"retry_initial": 0.01, "retry_max": 0.05}
_VALIDATOR = jsonschema.Draft202012Validator(
    schema(), format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
)


def assert_valid(event: CloudEvent | contract.Event | dict[str, Any]) -> dict[str, Any]:
    """Validate one event against schema v1; return it as the JSON object consumers see."""
    if isinstance(event, contract.Event):
        data: dict[str, Any] = json.loads(contract.encode(event))
    else:
        data = as_dict(event) if isinstance(event, CloudEvent) else event
    _VALIDATOR.validate(data)
    return data


class CheckedSink(MemorySink):
    """`MemorySink` that refuses (fails the test on) any event invalid against schema v1."""

    async def _publish(self, batch: Sequence[CloudEvent]) -> Result:
        for event in batch:
            assert_valid(event)
        return await super()._publish(batch)

    def dicts(self) -> list[dict[str, Any]]:
        return [as_dict(e) for e in self.events]

    def summary(self) -> list[tuple[str, str]]:
        """(kind, status) of every maintenance event received, in order."""
        return [
            (e["data"]["kind"], e["data"]["status"])
            for e in self.dicts()
            if e["type"] in EVENT_TYPES
        ]

    def of_type(self, event_type: str) -> list[dict[str, Any]]:
        return [e for e in self.dicts() if e["type"] == event_type]

    async def wait_for_type(
        self, event_type: str, count: int = 1, timeout: float = 10.0
    ) -> list[dict[str, Any]]:
        """Wait until `count` events of `event_type` arrived; return them."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(found := self.of_type(event_type)) < count:
            if loop.time() > deadline:
                raise AssertionError(f"{len(found)} {event_type} event(s), expected {count}")
            await asyncio.sleep(0.02)
        return found


_ROOT = Path(__file__).resolve().parent.parent


async def bridge_process(*args: str) -> asyncio.subprocess.Process:
    """`python -m bridge ARGS` as a child process, its stderr discarded (a fault of the real
    process is watched through what it serves and writes, not through its log)."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge",
        *args,
        cwd=_ROOT,
        stderr=asyncio.subprocess.DEVNULL,
    )


def running_as_root() -> bool:
    """Whether a test set-up may install what it lacks (apt-get) or must drop privileges to
    run a server that refuses root; False where there are no POSIX user ids (Windows)."""
    geteuid = getattr(os, "geteuid", None)
    return geteuid is not None and geteuid() == 0


def free_port() -> int:
    """A loopback port nobody listens on right now (for servers that need it up front)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def azure_file_config(tmp_path: Path, sim: Simulator | SimulatorThread, extra: str = "") -> Path:
    """A configuration file for a real `maintenance-bridge` process: the simulator's Azure,
    state in `tmp_path/state`, events to the file sink `tmp_path/events.jsonl`, a free
    listener port; `extra` is TOML appended as is."""
    config = tmp_path / "bridge.toml"
    config.write_text(f"""
[source]
provider = "azure"
[source.azure]
imds_url = "{sim.azure_url}"
poll_interval = 0.25
[state]
dir = "{tmp_path / "state"}"
[listener]
port = 0
[[sinks]]
type = "file"
path = "{tmp_path / "events.jsonl"}"
{extra}
""")
    return config


async def spawn_bridge(*args: str) -> asyncio.subprocess.Process:
    """`python -m bridge --log-format json ARGS` from the repository root, stderr piped."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge",
        "--log-format",
        "json",
        *args,
        cwd=REPOSITORY,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


def alive(pid: int) -> bool:
    """Running: not gone, and not a zombie nobody reaped (PID 1 of a container may not reap).
    psutil, so that the check means the same on Windows."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def eventually(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    """Poll `predicate` until it is true (for state outside the bridge: files, simulators,
    counters, HTTP answers); a predicate that returns an awaitable is awaited each time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        outcome = predicate()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return
        if loop.time() > deadline:
            raise AssertionError(f"condition not reached within {timeout}s")
        await asyncio.sleep(0.02)


def bridge_config(
    sim: Simulator, state_dir: Path, settings: dict[str, Any] | None = None, **source: Any
) -> Config:
    """A fast-polling configuration against `sim`; `settings` adds top-level sections."""
    gce = {"metadata_url": sim.gce_url, "long_poll_timeout": 2, "upcoming_poll_interval": 0.2}
    azure = {"imds_url": sim.azure_url, "poll_interval": 0.25, "first_call_timeout": 5.0}
    aws = {"imds_url": sim.aws_url, "poll_interval": 0.1, "maintenance_poll_interval": 0.2}
    gce.update(source.pop("gce", {}))
    azure.update(source.pop("azure", {}))
    aws.update(source.pop("aws", {}))
    return parse_config(
        {
            "source": {"gce": gce, "azure": azure, "aws": aws, **source},
            "state": {"dir": str(state_dir)},
            "delivery": {"retry_initial": 0.01, "retry_max": 0.05, "shutdown_timeout": 2.0},
            # Tests count the events they cause; heartbeats only where a test asks for them.
            "heartbeat": {"interval": 0},
            **(settings or {}),
        }
    )


@dataclass
class Running:
    bridge: Bridge
    sink: CheckedSink
    stop: asyncio.Event
    task: asyncio.Task[None]

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        await self.sink.wait_for(count, timeout)
        return self.sink.dicts()

    def watching(self) -> bool:
        """Whether the bridge's (first) watcher has been built and polls."""
        return bool(self.bridge.watchers)

    async def settle(self, seconds: float = 0.6) -> list[dict[str, Any]]:
        """Give the watchers time to (not) notice more; return everything received."""
        await asyncio.sleep(seconds)
        return self.sink.dicts()


@contextlib.asynccontextmanager
async def running_bridge(
    sim: Simulator,
    state_dir: Path,
    providers: Sequence[ProviderName] = ("gce",),
    sink: CheckedSink | None = None,
    settings: dict[str, Any] | None = None,
    **source: Any,
) -> AsyncIterator[Running]:
    config = bridge_config(sim, state_dir, settings, **source)
    sink = sink or CheckedSink("memory")
    bridge = compose(config, providers, [sink], **FAST_RETRY)
    stop = asyncio.Event()
    task = asyncio.create_task(bridge.run(stop))
    try:
        yield Running(bridge, sink, stop, task)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


@contextlib.asynccontextmanager
async def running_group(
    sim: Simulator, state_dir: Path, names: Sequence[str], settings: dict[str, Any] | None = None
) -> AsyncIterator[tuple[AzureGroup, dict[str, Running]]]:
    """Several Azure VMs of one group (`AzureGroup`), each with its own bridge (its state in
    `state_dir / name`, its sink named after it), all with the same `settings`."""
    async with AzureGroup(sim, names) as group, contextlib.AsyncExitStack() as stack:
        runs: dict[str, Running] = {}
        for name in names:
            runs[name] = await stack.enter_async_context(
                running_bridge(
                    sim,
                    state_dir / name,
                    ("azure",),
                    sink=CheckedSink(name),
                    settings=settings,
                    azure={"imds_url": group.imds_url(name)},
                )
            )
        for run in runs.values():  # every bridge has its watcher polling
            await eventually(run.watching)
        yield group, runs
