"""Notice-to-delivery latency on AWS: the bridge polling EC2 IMDS (IMDSv2), at its default
1 s and at 0.25 s, side by side with the GCE and Azure watchers of bench/latency.py.

The change is the Spot interruption notice: `spot/instance-action` appears (one `started`
event) and goes away (one `completed` event), alternately. Each bridge has its own
in-process simulator; a change is applied to both back to back (`t0` taken right before each
simulator applies it), and the next change waits until both bridges delivered it, plus a
random pause so that changes fall at every phase of the poll. The poll wait ends when the
simulator handed the first answer carrying the change (200 with the notice, or the 404
after it) to its HTTP server. No vendor sample is run: AWS publishes a shell loop, not a
program, and aws-node-termination-handler is a Kubernetes controller.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

from bench.latency import first_answer, until
from bench.procs import (
    Proc,
    bridge_config,
    simulators_running,
    start_bridge,
    stopped_on_exit,
    webhook,
)
from bench.receiver import Receiver
from bench.stats import Series
from bridge.simulator import Simulator

SPOT = "spot/instance-action"
POLLS = {"aws-1s": 1.0, "aws-0.25s": 0.25}


async def latency(
    count: int, workdir: Path, receiver: Receiver, profile_dir: Path | None = None
) -> list[Series]:
    series = {
        name: Series(f"bridge, AWS {interval:g} s poll", baseline=False, expected=count)
        for name, interval in POLLS.items()
    }
    streams = {name: name if profile_dir is None else f"profile-{name}" for name in POLLS}
    sims = {name: Simulator(provider="aws") for name in POLLS}
    procs: list[Proc] = []
    async with simulators_running(sims):
        for sim in sims.values():
            sim.aws.quirks.v2_required = True
        with stopped_on_exit(procs):
            for name, interval in POLLS.items():
                sim = sims[name]
                config = bridge_config(
                    workdir / f"{name}-latency",
                    "aws",
                    [webhook(receiver.url(streams[name]))],
                    gce_url=sim.gce_url,
                    azure_url=sim.azure_url,
                    aws_url=sim.aws_url,
                )
                config["source"]["aws"]["poll_interval"] = interval
                profile = None if profile_dir is None else profile_dir / f"{name}.prof"
                procs.append(await start_bridge(f"{name}-latency", workdir, config, profile))

            def polled(sim: Simulator) -> bool:
                return sum(r.path.endswith(SPOT) for r in sim.requests) >= 2

            await until(lambda: all(polled(s) for s in sims.values()), 30, "the first AWS polls")
            rng = random.Random(11)
            changes: list[tuple[bool, dict[str, float]]] = []
            for i in range(count):
                appears = i % 2 == 0
                at: dict[str, float] = {}
                for name, sim in sims.items():
                    at[name] = time.monotonic()
                    if appears:
                        sim.aws.interrupt("terminate")
                    else:
                        sim.aws.clear_spot()
                changes.append((appears, at))
                for name in POLLS:
                    await receiver.wait(streams[name], i + 1, timeout=15)
                await asyncio.sleep(rng.uniform(0.0, 1.0))
            for name in POLLS:
                records = await receiver.records(streams[name])
                for (appears, at), record in zip(changes, records, strict=False):
                    expected = "started" if appears else "completed"
                    if record.get("status") != expected:
                        raise RuntimeError(f"{name}: got {record.get('status')}, not {expected}")
                    t0 = at[name]
                    answered = first_answer(sims[name], SPOT, t0, 200 if appears else 404)
                    if answered is not None:
                        series[name].add(t0, answered, record["at"])
            for proc in procs:
                await proc.stop()
    return list(series.values())
