"""kill -9 at random points: nothing lost, nothing doubled under two ids, order kept.

For each seed the test plays a scenario of transitions against the simulator while a real
`maintenance-bridge run` process delivers to a real HTTP receiver. After each transition,
at a random moment (before the watcher sees it, while it is spooled, mid-send), the process
may be killed with SIGKILL and started again on the same state directory. The next
transition is made only once the previous one has been received, so every transition is
observable. At the end: every transition was received at least once, each under one single
event id, and in the order it happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal

import pytest
from aiohttp import web

from bridge.simulator import Simulator
from tests.support import assert_valid

pytestmark = pytest.mark.posix  # SIGTERM to the bridge between kills

ROOT = Path(__file__).resolve().parent.parent
SEEDS = range(20)


class Receiver:
    """A webhook endpoint that records every delivery (duplicates included)."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        self.received.append(assert_valid(json.loads(await request.read())))
        self.arrived.set()
        return web.Response(status=204)

    def transitions(self) -> list[tuple[str, str]]:
        return [(e["data"]["notice_id"], e["data"]["status"]) for e in self.received]


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    rec = Receiver()
    app = web.Application()
    app.router.add_post("/hook", rec.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield rec, f"http://127.0.0.1:{port}/hook"
    await runner.cleanup()


class Process:
    """`maintenance-bridge <command> --config <config>` (`run` by default) as a child."""

    def __init__(self, config: Path, command: str = "run") -> None:
        self.config = config
        self.command = command
        self.proc: asyncio.subprocess.Process | None = None
        self.kills = 0

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bridge",
            "--log-format",
            "json",
            self.command,
            "--config",
            str(self.config),
            cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()  # SIGKILL
        await self.proc.wait()
        self.kills += 1

    async def stop(self) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(self.proc.wait(), 20)


def gce_steps(sim: Simulator) -> list[tuple[Callable[[], object], str]]:
    key = "instance/maintenance-event"
    return [
        (lambda: sim.gce.set(key, "MIGRATE_ON_HOST_MAINTENANCE"), "started"),
        (lambda: sim.gce.set(key, "NONE"), "completed"),
        (lambda: sim.gce.set(key, "TERMINATE_ON_HOST_MAINTENANCE"), "started"),
        (lambda: sim.gce.set(key, "NONE"), "completed"),
    ]


def azure_steps(sim: Simulator) -> list[tuple[Callable[[], object], str]]:
    ids = ["11111111-0000-4000-8000-000000000001", "11111111-0000-4000-8000-000000000002"]
    add = sim.azure.add_event
    return [
        (lambda: add(event_id=ids[0], event_type="Reboot", auto_complete=False), "scheduled"),
        (lambda: sim.azure.start_event(ids[0]), "started"),
        (lambda: sim.azure.remove_event(ids[0]), "completed"),
        (lambda: add(event_id=ids[1], event_type="Freeze", auto_complete=False), "scheduled"),
        (lambda: sim.azure.remove_event(ids[1]), "cancelled"),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
async def test_kill_9_at_random_points_loses_and_doubles_nothing(
    seed: int, tmp_path: Path, receiver: tuple[Receiver, str]
) -> None:
    rec, url = receiver
    rng = random.Random(seed)
    provider: Literal["gce", "azure"] = "gce" if seed % 2 == 0 else "azure"
    async with Simulator(provider=provider) as sim:
        sim.faults.set(provider=provider, rate_limit=False)
        config = tmp_path / "bridge.toml"
        config.write_text(f"""
[source]
provider = "{provider}"
[source.gce]
metadata_url = "{sim.gce_url}"
long_poll_timeout = 5
[source.azure]
imds_url = "{sim.azure_url}"
poll_interval = 0.2
[state]
dir = "{tmp_path / "state"}"
[listener]
port = 0
[delivery]
retry_initial = 0.05
retry_max = 0.2
[heartbeat]
interval = 0
[[sinks]]
type = "webhook"
url = "{url}"
""")
        bridge = Process(config)
        await bridge.start()
        steps = gce_steps(sim) if provider == "gce" else azure_steps(sim)
        try:
            for index, (make, status) in enumerate(steps):
                make()
                await asyncio.sleep(rng.uniform(0.0, 0.6))
                if rng.random() < 0.7:
                    await bridge.kill()
                    await bridge.start()
                deadline = asyncio.get_running_loop().time() + 30
                while sum(1 for t in rec.transitions() if t[1] == status) < sum(
                    1 for _, s in steps[: index + 1] if s == status
                ):
                    assert asyncio.get_running_loop().time() < deadline, (
                        f"seed {seed}: step {index} ({status}) never delivered; got "
                        f"{rec.transitions()}"
                    )
                    rec.arrived.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(rec.arrived.wait(), 1.0)
        finally:
            await bridge.stop()

    expected = [status for _, status in steps]
    first_seen: list[tuple[str, str]] = []
    ids: dict[tuple[str, str], set[str]] = {}
    for event in rec.received:
        key = (event["data"]["notice_id"], event["data"]["status"])
        ids.setdefault(key, set()).add(event["id"])
        if key not in first_seen:
            first_seen.append(key)
    assert [status for _, status in first_seen] == expected, first_seen  # all, in order
    assert all(len(v) == 1 for v in ids.values()), ids  # never two ids for one transition
    assert bridge.kills >= 1  # the seed really exercised a crash
