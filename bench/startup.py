"""Start-up: from spawning the process to its first metadata request reaching the simulator.

`t0` is `time.monotonic()` right before the driver spawns the process; the end is the
`received` time of the first request in the simulator's log. Repeated, sequentially, and
the median kept. The import profile (`python -X importtime`) says where the time goes.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.procs import CLOUD_SINKS, Proc, bridge_config, child_env, spawn, start_bridge, webhook
from bench.receiver import Receiver
from bridge.simulator import Simulator

#: What `maintenance-bridge run` imports before its first metadata request (GCE, webhook).
RUN_PATH = (
    "bridge.cli",
    "bridge.runner",
    "bridge.providers.gce.watcher",
    "bridge.pipeline.spool",
    "sinks.webhook",
)


@dataclass
class Startup:
    name: str
    baseline: bool
    seconds: float
    runs: list[float]


async def _first_request(sim: Simulator, since: int, proc: Proc, timeout: float = 30.0) -> float:
    deadline = time.monotonic() + timeout
    while True:
        fresh = sim.log.since(since)
        if fresh:
            return fresh[0].received
        if proc.process.returncode is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name} made no metadata request; see {proc.log}")
        await asyncio.sleep(0.001)


async def measure(runs: int, workdir: Path, receiver: Receiver) -> list[Startup]:
    results: list[Startup] = []
    async with Simulator(provider="gce") as sim:
        plain = [webhook(receiver.url("startup"))]
        sdks = [*plain, CLOUD_SINKS["pubsub"], CLOUD_SINKS["eventhubs"]]
        cases: list[tuple[str, bool, list[dict[str, object]] | None]] = [
            ("bridge, webhook sink (no cloud SDK)", False, plain),
            ("bridge, webhook + Pub/Sub + Event Hubs sinks", False, sdks),
            ("Google's sample (GCE)", True, None),
        ]
        for name, baseline, sinks in cases:
            times: list[float] = []
            for run in range(runs):
                since = sim.log.all()[-1].seq if sim.log.all() else 0
                t0 = time.monotonic()
                if sinks is not None:
                    config = bridge_config(
                        workdir / f"startup-{len(results)}-{run}",
                        "gce",
                        sinks,
                        gce_url=sim.gce_url,
                        azure_url=sim.azure_url,
                    )
                    proc = await start_bridge(f"startup-{len(results)}-{run}", workdir, config)
                else:
                    proc = await spawn(
                        f"startup-sample-{run}", ["-m", "bench.baseline", "gce", sim.gce_url],
                        workdir, stamped_stdout=True,
                    )  # fmt: skip
                try:
                    times.append(await _first_request(sim, since, proc) - t0)
                finally:
                    await proc.stop()
            results.append(Startup(name, baseline, statistics.median(times), times))
    return results


def import_profile(with_sdks: bool, top: int = 10) -> tuple[float, list[tuple[float, str]]]:
    """`python -X importtime` of what `maintenance-bridge run` imports before its first
    request: the total (ms) and the costliest third-party packages (cumulative ms each)."""
    modules = [
        "bridge.cli",
        "bridge.runner",
        "bridge.providers.gce.watcher",
        "bridge.pipeline.spool",
        "sinks.webhook",
    ]
    if with_sdks:
        modules += ["sinks.pubsub", "sinks.eventhubs", "google.cloud.pubsub_v1", "azure.eventhub"]
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "; ".join(f"import {m}" for m in modules)],
        capture_output=True,
        text=True,
        env=child_env(),
        check=True,
    )
    costs: dict[str, float] = {}
    total = 0.0
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _self, cumulative, name = line.split(":", 1)[1].split("|")
        ms = int(cumulative) / 1000
        package = name.strip().split(".")[0]
        if name.startswith(" ") and not name.startswith("  "):
            total += ms  # a root of the import tree
        if package not in ("bridge", "sinks"):
            costs[package] = max(costs.get(package, 0.0), ms)
    ranked = sorted(((ms, name) for name, ms in costs.items()), reverse=True)
    return total, ranked[:top]
