"""Idle cost and footprint: the bridge watching with no notices, as a process, for a while.

All watchers idle at once against one simulator (Azure's rate limit off, since several
clients share 127.0.0.1): the bridge on GCE (long poll, 60 s timeout), on Azure (1 s poll)
and on AWS (IMDSv2, 1 s poll, scheduled events every 60 s) with only the webhook sink, the
bridge on GCE with each cloud sink configured (pointed at loopback, nothing to send), and the
two vendor samples. CPU time is user + system of the
process over the window after a warm-up, scaled to an hour; footprint is the peak RSS
(VmHWM) over the whole life of the process.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from bench.procs import CLOUD_SINKS, Proc, bridge_config, spawn, start_bridge, stopped_on_exit
from bench.procs import webhook as webhook_sink
from bench.profiles import by_package
from bench.receiver import Receiver
from bridge.simulator import Simulator


@dataclass
class Idle:
    name: str
    baseline: bool
    cpu_per_hour: float | None
    peak_rss_mb: float


async def measure(seconds: float, warmup: float, workdir: Path, receiver: Receiver) -> list[Idle]:
    async with Simulator(provider="all") as sim:
        sim.faults.set("azure", rate_limit=False)
        webhook = [webhook_sink(receiver.url("idle"))]

        def config(name: str, provider: str, sinks: list[dict[str, object]]) -> dict[str, object]:
            return bridge_config(
                workdir / name,
                provider,
                sinks,
                gce_url=sim.gce_url,
                azure_url=sim.azure_url,
                aws_url=sim.aws_url,
            )

        plan: list[tuple[str, bool, bool, dict[str, object] | None, list[str]]] = [
            ("bridge, GCE, webhook sink", False, True, config("idle-gce", "gce", webhook), []),
            ("bridge, Azure 1 s, webhook sink", False, True,
             config("idle-az", "azure", webhook), []),
            ("bridge, AWS 1 s, webhook sink", False, True,
             config("idle-aws", "aws", webhook), []),
            ("bridge, GCE, webhook + Pub/Sub sinks", False, False,
             config("idle-pubsub", "gce", [*webhook, CLOUD_SINKS["pubsub"]]), []),
            ("bridge, GCE, webhook + Event Hubs sinks", False, False,
             config("idle-eventhubs", "gce", [*webhook, CLOUD_SINKS["eventhubs"]]), []),
            ("Google's sample (GCE)", True, True, None, ["gce", sim.gce_url]),
            ("Microsoft's sample (Azure 1 s)", True, True, None, ["azure", sim.azure_url]),
        ]  # fmt: skip
        procs: list[Proc] = []
        with stopped_on_exit(procs):
            for index, (_, _, _, cfg, sample_args) in enumerate(plan):
                if cfg is not None:
                    procs.append(await start_bridge(f"idle-{index}", workdir, cfg))
                else:
                    procs.append(
                        await spawn(
                            f"idle-sample-{index}",
                            ["-m", "bench.baseline", *sample_args],
                            workdir,
                            stamped_stdout=True,
                        )
                    )
            await asyncio.sleep(warmup)
            for proc in procs:
                if proc.process.returncode is not None:
                    raise RuntimeError(f"{proc.name} exited early; see {proc.log}")
            before = [proc.cpu_seconds() for proc in procs]
            await asyncio.sleep(seconds)
            after = [proc.cpu_seconds() for proc in procs]
            results = [
                Idle(
                    name,
                    baseline,
                    (end - start) * 3600 / seconds if timed else None,
                    proc.peak_rss_mb(),
                )
                for (name, baseline, timed, _, _), proc, start, end in zip(
                    plan, procs, before, after, strict=True
                )
            ]
            for proc in procs:
                await proc.stop()
    return results


_RSS_BY_IMPORT = """
import sys, psutil
me = psutil.Process()
last = me.memory_info().rss
print(f"{last / 2**20:.1f} interpreter + psutil")
for name in sys.argv[1:]:
    __import__(name)
    now = me.memory_info().rss
    print(f"{(now - last) / 2**20:.1f} {name}")
    last = now
print(f"{last / 2**20:.1f} total")
"""


def rss_by_import(modules: tuple[str, ...]) -> list[str]:
    """Resident memory each import of the run path adds, in a fresh interpreter (MiB):
    where an idle bridge's footprint comes from."""
    import subprocess
    import sys

    from bench.procs import child_env

    done = subprocess.run(
        [sys.executable, "-c", _RSS_BY_IMPORT, *modules],
        capture_output=True,
        text=True,
        env=child_env(),
        check=True,
    )
    return done.stdout.splitlines()


async def profile_azure_poll(seconds: float, workdir: Path, receiver: Receiver) -> list[str]:
    """The idle Azure bridge (1 s poll) under cProfile: CPU per poll, by package."""
    import pstats

    from bench.procs import to_toml

    out = workdir / "idle-azure.prof"
    async with Simulator(provider="azure") as sim:
        directory = workdir / "idle-profile"
        directory.mkdir(parents=True, exist_ok=True)
        config = bridge_config(
            directory, "azure", [webhook_sink(receiver.url("idle-profile"))],
            gce_url=sim.gce_url, azure_url=sim.azure_url,
        )  # fmt: skip
        (directory / "config.toml").write_text(to_toml(config))
        proc = await spawn(
            "idle-profile",
            ["-m", "cProfile", "-o", str(out), "-m", "bridge", "--log-format", "json",
             "run", "--config", str(directory / "config.toml")],
            directory,
        )  # fmt: skip
        await asyncio.sleep(seconds)
        polls = sum(r.path.endswith("scheduledevents") for r in sim.requests)
        await proc.stop()
    return by_package(pstats.Stats(str(out)), polls, "poll")
