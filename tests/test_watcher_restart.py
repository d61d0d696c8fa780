"""The runner's supervision of a watcher: a watcher that fails is closed and rebuilt from its
checkpoint by the one backoff policy (`backoff.keep_running`), 1 s at first and doubling,
from 1 s again once it committed an update; `/readyz` says it is crash-looping meanwhile.

Real parts: the bridge, its SQLite spool and dispatcher, the GCE watcher against the
simulator over HTTP. Mocked: the bug (a watcher subclass that fails when told, as no input
can make the real parsers fail any more) and the restart delay (the bridge's `sleep`, so the
test does not wait a real second per restart; the delays asked for are recorded).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bridge.pipeline.spool import Spool
from bridge.pipeline.watchers.base import Update
from bridge.providers.gce import watcher as gce
from bridge.runner import Bridge
from bridge.simulator import Simulator
from bridge.surface.health import HealthMonitor
from tests.support import CheckedSink, bridge_config, eventually


class Script:
    """How each rebuilt watcher behaves: "crash" at once, or "watch" for real (the test may
    switch it to "crash on the next update"); and the
    checkpoints they were built from and how many were closed."""

    def __init__(self, *lives: str) -> None:
        self.lives = list(lives)
        self.checkpoints: list[dict[str, Any] | None] = []
        self.closed = 0


class _Scripted(gce.GceWatcher):
    script: Script
    life: str

    async def watch(self) -> AsyncIterator[Update]:
        if self.life == "crash":
            raise RuntimeError("a bug in the watcher")
        async for update in super().watch():
            if self.life == "crash on the next update":
                raise RuntimeError("a bug in the watcher")
            yield update

    async def aclose(self) -> None:
        self.script.closed += 1
        await super().aclose()


async def test_a_failing_watcher_is_closed_and_rebuilt_from_its_checkpoint(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    config = bridge_config(gce_sim, tmp_path)
    script = Script("crash", "crash", "watch", "crash", "watch")

    def build(checkpoint: dict[str, Any] | None) -> _Scripted:
        script.checkpoints.append(checkpoint)
        source = config.source.gce
        watcher = _Scripted(gce.new_client(source, retry_initial=0.01, retry_max=0.05), source)
        watcher.script, watcher.life = script, script.lives.pop(0)
        return watcher

    delays: list[float] = []
    resume = asyncio.Event()

    async def sleep(delay: float) -> None:
        delays.append(delay)
        if len(delays) == 2:
            await resume.wait()  # hold the crash loop so that /readyz can be read

    sink = CheckedSink("memory")
    bridge = Bridge(config, {"gce": build}, [sink], Spool(tmp_path, [sink.name]), sleep=sleep)
    monitor = HealthMonitor()
    monitor.attach(bridge)
    stop = asyncio.Event()
    task = asyncio.create_task(bridge.run(stop))
    try:
        await eventually(lambda: len(delays) == 2)
        (crash,) = [c for c in monitor.readiness() if c.name == "watcher:gce"]
        assert not crash.ok
        assert crash.detail.startswith("failed 2 time(s)")
        assert "RuntimeError: a bug in the watcher" in crash.detail
        resume.set()

        gce_sim.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
        await sink.wait_for(1)
        # The commit forgot the crashes.
        await eventually(lambda: "watcher:gce" not in {c.name for c in monitor.readiness()})
        watcher = bridge.watchers["gce"]
        assert isinstance(watcher, _Scripted)
        watcher.life = "crash on the next update"
        gce_sim.gce.set("instance/maintenance-event", "NONE")
        await eventually(lambda: len(script.checkpoints) == 5)  # crashed once more on the way
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)

    # Doubling, and from 1 s again after progress (the policy adds under 1 s of jitter).
    assert [int(d) for d in delays] == [1, 2, 1, 2]
    assert script.closed == 5  # every watcher built was closed: four crashes and the stop
    assert script.checkpoints[0] is None
    assert script.checkpoints[-1] is not None  # rebuilt from what the commit saved
