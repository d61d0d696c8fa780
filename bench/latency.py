"""Notice-to-delivery latency: the bridge and the vendors' samples, side by side, one run.

Each watcher gets its own in-process simulator (so the request log tells whose poll
carried a change) and every change is applied to all of them (GCE: in turns, below); `t0` is
`time.monotonic()` taken right before each simulator applies it, on the driver's event loop,
which is also the simulators' loop. The delivery moment is stamped by the receiver process
(or by the sample as it prints); the poll wait ends when the simulator handed the first
answer carrying the change to its HTTP server (`RequestRecord.answered`).

GCE: `instance/maintenance-event` toggles between MIGRATE_ON_HOST_MAINTENANCE and NONE; each
change is one event (started / completed) and one callback of Google's sample. The watchers
take turns: a change reaches the bridge, and once the bridge has delivered it and long-polls
again, the sample; then the next change, once the sample polls again. Applied to both at
once, each watcher's figure held the other's work on 2 cores: the sample is done first and
re-arms at once (a new connection per long poll, which the plain front meets with a new
thread and a new upstream connection), right inside the bridge's commit and POST, about
0.6 ms of the bridge's part against the plain servers (bench/spans.py, rerun without the
sample). Both still run in one run, transition by transition, on the same host.

Azure: events are added (one `scheduled` event) and removed (one `cancelled` event) at
random moments, on average `spacing` seconds apart, so several transitions can fall into one
poll interval, as they would on a busy host; an event is removed only after every watcher
has polled since it appeared. One sequence of changes feeds the bridge at the default 1 s
poll, the bridge at 0.25 s and Microsoft's sample (which sleeps 1 s between polls).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from bench.plain import PlainFront, Served
from bench.procs import (
    Proc,
    bridge_config,
    simulators_running,
    spawn,
    start_bridge,
    stopped_on_exit,
    webhook,
)
from bench.receiver import Receiver
from bench.stats import Series
from bridge.simulator import Simulator

MAINTENANCE = "instance/maintenance-event"
GCE_VALUES = ("MIGRATE_ON_HOST_MAINTENANCE", "NONE")
#: An Azure event is removed only this long after it appeared (every watcher polled since).
AZURE_MIN_AGE = 1.6


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"benchmark: {what} did not happen within {timeout:g}s")
        await asyncio.sleep(0.002)


#: Appended to the series names of a run against the plain servers (`bench.plain`).
PLAIN = " (plain http.server)"


@contextlib.asynccontextmanager
async def served(sim: Simulator, plain: bool) -> AsyncIterator[Served]:
    """What the watchers talk to: the simulator itself, or `http.server` in front of it."""
    if not plain:
        yield sim
        return
    async with PlainFront(sim) as front:
        yield front


def first_answer(sim: Served, path_end: str, after: float, status: int = 200) -> float | None:
    """When the server handed over its first answer to `path_end` at or after `after`
    (with `status`: a notice that went away answers 404 on AWS)."""
    for record in sim.requests:
        if (
            record.method == "GET"
            and record.path.endswith(path_end)
            and record.answered is not None
            and record.answered >= after
            and record.status == status
        ):
            return record.answered
    return None


def printed(proc: Proc, lines: int) -> Callable[[], bool]:
    return lambda: len(proc.lines) >= lines


def hanging(sim: Served) -> bool:
    """A long poll on maintenance-event is waiting (the watcher is ready for a change)."""
    return any(
        r.path.endswith(MAINTENANCE) and "last_etag" in r.query and r.answered is None
        for r in sim.requests
    )


async def gce(
    count: int,
    workdir: Path,
    receiver: Receiver,
    profile_dir: Path | None = None,
    plain: bool = False,
) -> list[Series]:
    """With `plain`, the watchers poll `http.server` fronts and `receiver` is the plain one."""
    suffix, prefix = (PLAIN, "plain-") if plain else ("", "")
    ours = Series(f"bridge, GCE long poll{suffix}", baseline=False, expected=count)
    theirs = Series(f"Google's sample, GCE long poll{suffix}", baseline=True, expected=count)
    async with (
        Simulator(provider="gce") as sim,
        Simulator(provider="gce") as base_sim,
        served(sim, plain) as ours_at,
        served(base_sim, plain) as base_at,
    ):
        procs: list[Proc] = []
        with stopped_on_exit(procs):
            config = bridge_config(
                workdir / f"{prefix}gce-latency",
                "gce",
                [webhook(receiver.url(_stream(profile_dir, "gce")))],
                gce_url=ours_at.gce_url,
                azure_url=ours_at.azure_url,
            )
            procs.append(
                await start_bridge(
                    f"{prefix}gce-latency", workdir, config, spans_file(profile_dir, "gce")
                )
            )
            sample = await spawn(
                f"{prefix}gce-sample", ["-m", "bench.baseline", "gce", base_at.gce_url], workdir,
                stamped_stdout=True,
            )  # fmt: skip
            procs.append(sample)
            await until(
                lambda: hanging(ours_at) and hanging(base_at), 30, "the watchers' first poll"
            )
            changes: list[tuple[float, float]] = []
            rng = random.Random(7)
            for i in range(count):  # the watchers take turns (see the module docstring)
                value = GCE_VALUES[i % 2]
                t_ours = time.monotonic()
                sim.gce.set(MAINTENANCE, value)
                await receiver.wait(_stream(profile_dir, "gce"), i + 1)
                await until(lambda: hanging(ours_at), 10, "the bridge's new long poll")
                await asyncio.sleep(rng.uniform(0.0, 0.01))
                t_base = time.monotonic()
                base_sim.gce.set(MAINTENANCE, value)
                changes.append((t_ours, t_base))
                # its "started" line, then one line per change
                await until(printed(sample, i + 2), 10, "the GCE sample's print")
                await until(lambda: hanging(base_at), 10, "the sample's new long poll")
                await asyncio.sleep(rng.uniform(0.0, 0.01))
            records = await receiver.records(_stream(profile_dir, "gce"))
            for i, record in enumerate(records[:count]):
                expected = GCE_VALUES[i % 2]
                if (record.get("raw") or {}).get("value") != expected:
                    raise RuntimeError(f"event {i} carries {record.get('raw')}, not {expected}")
                t0 = changes[i][0]
                answered = first_answer(ours_at, MAINTENANCE, t0)
                if answered is not None:
                    ours.add(t0, answered, record["at"])
            for i, (stamp, _text) in enumerate(sample.lines[1 : count + 1]):
                t0 = changes[i][1]
                answered = first_answer(base_at, MAINTENANCE, t0)
                if answered is not None:
                    theirs.add(t0, answered, stamp)
            for proc in procs:
                await proc.stop()
    return [ours, theirs]


@dataclass
class AzureChange:
    event_id: str
    added: bool
    at: dict[str, float]
    incarnation: int


async def azure(
    count: int,
    workdir: Path,
    receiver: Receiver,
    spacing: float,
    profile_dir: Path | None = None,
    plain: bool = False,
) -> list[Series]:
    """With `plain`, the watchers poll `http.server` fronts and `receiver` is the plain one."""
    suffix, prefix = (PLAIN, "plain-") if plain else ("", "")
    polls = {"azure-1s": 1.0, "azure-0.25s": 0.25}
    series = {
        "azure-1s": Series(f"bridge, Azure 1 s poll{suffix}", baseline=False, expected=count),
        "azure-0.25s": Series(f"bridge, Azure 0.25 s poll{suffix}", baseline=False, expected=count),
        "sample": Series(
            f"Microsoft's sample, Azure 1 s poll{suffix}", baseline=True, expected=count
        ),
    }
    sims = {name: Simulator(provider="azure") for name in series}
    procs: list[Proc] = []
    async with simulators_running(sims), contextlib.AsyncExitStack() as stack:
        for sim in sims.values():
            sim.faults.set("azure", rate_limit=False)
        at = {name: await stack.enter_async_context(served(sim, plain))
              for name, sim in sims.items()}  # fmt: skip
        with stopped_on_exit(procs):
            for name, interval in polls.items():
                config = bridge_config(
                    workdir / f"{prefix}{name}-latency",
                    "azure",
                    [webhook(receiver.url(_stream(profile_dir, name)))],
                    gce_url=at[name].gce_url,
                    azure_url=at[name].azure_url,
                )
                config["source"]["azure"]["poll_interval"] = interval
                spans = spans_file(profile_dir, name)
                procs.append(await start_bridge(f"{prefix}{name}-latency", workdir, config, spans))
            sample = await spawn(
                f"{prefix}azure-sample",
                ["-m", "bench.baseline", "azure", at["sample"].azure_url],
                workdir, stamped_stdout=True,
            )  # fmt: skip
            procs.append(sample)

            def polled_twice(served: Served) -> bool:
                return sum(r.path.endswith("scheduledevents") for r in served.requests) >= 2

            await until(
                lambda: all(polled_twice(s) for s in at.values()), 30, "the first Azure polls"
            )
            changes = await _play_azure(count, sims, spacing)
            for name in polls:
                await receiver.wait(_stream(profile_dir, name), count, timeout=15)
            last = changes[-1].incarnation if changes else 0
            await until(lambda: _processed(sample) >= last, 15, "the Azure sample's last print")
            for name in polls:
                records = await receiver.records(_stream(profile_dir, name))
                by_key = {(r["notice_id"], r["status"]): r for r in records}
                for change in changes:
                    status = "scheduled" if change.added else "cancelled"
                    record = by_key.get((change.event_id, status))
                    answered = first_answer(at[name], "scheduledevents", change.at[name])
                    if record is not None and answered is not None:
                        t0 = change.at[name]
                        series[name].add(t0, answered, record["at"])
            printed = [
                (stamp, int(text.rsplit(" ", 1)[1]))
                for stamp, text in sample.lines
                if text.startswith("Processed events from document:")
            ]
            for change in changes:
                t0 = change.at["sample"]
                seen = next((s for s, n in printed if n >= change.incarnation and s >= t0), None)
                answered = first_answer(at["sample"], "scheduledevents", t0)
                if seen is not None and answered is not None:
                    series["sample"].add(t0, answered, seen)
            for proc in procs:
                await proc.stop()
    return list(series.values())


def spans_file(directory: Path | None, name: str) -> Path | None:
    """Where the bridge of series `name` times its steps (`bench.spans`), when profiling."""
    return None if directory is None else directory / f"{name}.spans"


def _stream(profile_dir: Path | None, name: str) -> str:
    """The receiver's name for a series: a profiling rerun must not count the first run's."""
    return name if profile_dir is None else f"profile-{name}"


def _processed(sample: Proc) -> int:
    numbers = [
        int(text.rsplit(" ", 1)[1])
        for _, text in sample.lines
        if text.startswith("Processed events from document:")
    ]
    return max(numbers, default=0)


async def _play_azure(count: int, sims: dict[str, Simulator], spacing: float) -> list[AzureChange]:
    rng = random.Random(9)
    active: list[tuple[str, float]] = []
    changes: list[AzureChange] = []
    for _ in range(count):
        await asyncio.sleep(rng.uniform(0.0, 2 * spacing))
        at: dict[str, float] = {}
        if active and time.monotonic() - active[0][1] > AZURE_MIN_AGE:
            event_id, _ = active.pop(0)
            for name, sim in sims.items():
                at[name] = time.monotonic()
                sim.azure.remove_event(event_id)
            added = False
        else:
            event_id = str(uuid.UUID(int=rng.getrandbits(128))).upper()
            for name, sim in sims.items():
                at[name] = time.monotonic()
                sim.azure.add_event(event_id=event_id, event_type="Reboot", not_before_in=3600.0)
            active.append((event_id, time.monotonic()))
            added = True
        incarnation = next(iter(sims.values())).azure.incarnation
        changes.append(AzureChange(event_id, added, at, incarnation))
    return changes
