"""A webhook receiver that is down for a while (503, hanging, refusing connections) and then
recovers gets every event, in order; one that answers 400 gets it dead-lettered, replayably.

Real parts only: the webhook sink with its HTTP client, the SQLite spool, the dispatcher and
an aiohttp receiver on loopback that is switched between behaviours (and stopped and
restarted on the same port to refuse connections).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bridge.config import parse_config
from bridge.pipeline.dispatch import Dispatcher
from bridge.pipeline.events import serialize
from bridge.pipeline.spool import NewEvent, Spool
from bridge.runner import build_sinks
from tests.factories import sample_events
from tests.support import assert_valid, eventually


class FlakyReceiver:
    def __init__(self) -> None:
        self.mode = "ok"  # ok | 503 | hang | 400
        self.received: list[dict[str, Any]] = []
        self.attempts = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        self.attempts += 1
        body = await request.read()
        if self.mode == "503":
            return web.Response(status=503, headers={"Retry-After": "0"})
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if self.mode == "400":
            return web.Response(status=400, text="schema mismatch")
        self.received.append(assert_valid(json.loads(body)))
        return web.Response(status=204)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"


@pytest.fixture
async def receiver() -> AsyncIterator[FlakyReceiver]:
    rec = FlakyReceiver()
    await rec.start()
    yield rec
    await rec.stop()


async def deliver(tmp_path: Path, url: str) -> tuple[Spool, Dispatcher, list[str]]:
    config = parse_config({"sinks": [{"type": "webhook", "url": url, "timeout": 0.3}]})
    sinks = build_sinks(config)
    spool = Spool(tmp_path, [s.name for s in sinks])
    await spool.open()
    events = sample_events(8)
    await spool.commit(
        [NewEvent(e.get_id(), e.get_source(), e.get_type(), serialize(e)) for e in events]
    )
    dispatcher = Dispatcher(spool, sinks, retry_initial=0.02, retry_max=0.1)
    dispatcher.start()
    dispatcher.notify()
    return spool, dispatcher, [e.get_id() for e in events]


@pytest.mark.parametrize("outage", ["503", "hang", "refuse"])
async def test_everything_arrives_after_the_receiver_recovers(
    tmp_path: Path, receiver: FlakyReceiver, outage: str
) -> None:
    if outage == "refuse":
        await receiver.stop()
    else:
        receiver.mode = outage
    spool, dispatcher, ids = await deliver(tmp_path, receiver.url)
    try:
        # Down for a while: several failed attempts (each hanging one takes its 0.3 s timeout).
        await eventually(lambda: dispatcher.stats["webhook"].retried >= 3, timeout=15.0)
        assert receiver.received == []
        if outage == "refuse":
            await receiver.start()  # same port
        receiver.mode = "ok"
        await eventually(lambda: len(receiver.received) >= len(ids), timeout=15.0)
        assert [e["id"] for e in receiver.received] == ids  # all, in order, once each
        await eventually(lambda: dispatcher.stats["webhook"].delivered == len(ids), timeout=15.0)
    finally:
        await dispatcher.stop(1.0)
        assert await spool.depth() == {}
        assert await spool.dead_letters() == []
        await spool.close()


async def test_a_400_is_dead_lettered_and_replay_delivers_it(
    tmp_path: Path, receiver: FlakyReceiver
) -> None:
    receiver.mode = "400"
    spool, dispatcher, ids = await deliver(tmp_path, receiver.url)
    try:
        await eventually(
            lambda: dispatcher.stats["webhook"].dead_lettered == len(ids), timeout=15.0
        )
        letters = await spool.dead_letters()
        assert [d.id for d in letters] == ids
        assert all("HTTP 400" in d.reason for d in letters)
        receiver.mode = "ok"
        assert await spool.replay() == len(ids)
        dispatcher.notify()
        await eventually(lambda: len(receiver.received) == len(ids), timeout=15.0)
        assert [e["id"] for e in receiver.received] == ids
    finally:
        await dispatcher.stop(1.0)
        await spool.close()


@pytest.mark.posix  # SIGTERM/SIGINT to a child process
async def test_sigterm_during_a_backlog_exits_within_the_deadline_keeping_the_rest(
    tmp_path: Path, receiver: FlakyReceiver
) -> None:
    import signal
    import sys
    import time

    from bridge.simulator import Simulator

    receiver.mode = "hang"  # every send stays in flight
    state = tmp_path / "state"
    spool = Spool(state, ["webhook"])
    await spool.open()
    events = sample_events(50)
    await spool.commit(
        [NewEvent(e.get_id(), e.get_source(), e.get_type(), serialize(e)) for e in events]
    )
    await spool.close()
    async with Simulator(provider="azure") as sim:
        config = tmp_path / "bridge.toml"
        config.write_text(f"""
[source]
provider = "azure"
[source.azure]
imds_url = "{sim.azure_url}"
[state]
dir = "{state}"
[listener]
port = 0
[delivery]
shutdown_timeout = 1.0
[heartbeat]
interval = 0
[[sinks]]
type = "webhook"
url = "{receiver.url}"
timeout = 30
""")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bridge",
            "run",
            "--config",
            str(config),
            stderr=asyncio.subprocess.DEVNULL,
        )
        await eventually(lambda: receiver.attempts >= 1, timeout=15.0)  # a send is in flight
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 10)
        elapsed = time.monotonic() - started
    assert code == 0
    assert elapsed < 3.0  # the 1 s deadline, plus process exit
    spool = Spool(state, ["webhook"])
    await spool.open()
    try:
        assert (await spool.depth())["webhook"][0] == 50  # nothing acknowledged, all kept
    finally:
        await spool.close()
