"""`python -m bench [--quick] [--out DIR]`: run every benchmark, write report.md and latency.png.

The full run takes 5 to 6 minutes on a 2-core VM; `--quick` runs each part on tiny
sizes in about a minute (to check the suite works, not to quote its figures). Latency and
the webhook drain run twice: against our aiohttp simulator and receiver, which write each
answer in one piece, and against plain `http.server` ones (`bench.plain`), which write the
head and the body separately, as many real servers do.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench import aws, drain, idle, latency, startup
from bench.plain import ANSWERED
from bench.procs import ROOT, Proc, spawn, webhook
from bench.receiver import Receiver
from bench.report import (
    ANSWERED_DRAIN,
    ANSWERING_LABEL,
    PLAIN_DRAIN,
    PLAIN_LABEL,
    Results,
    plot,
    render,
    targets,
)
from bench.spans import breakdown
from bench.stats import Series, worst
from tests.support import free_port


@dataclass(frozen=True)
class Sizes:
    transitions: int
    #: Azure transitions against the plain servers (a run lasts transitions x spacing).
    plain_azure_transitions: int
    azure_spacing: float
    idle_seconds: float
    idle_warmup: float
    startup_runs: int
    drain_events: int
    commit_samples: int
    pubsub: bool


FULL = Sizes(200, 100, 0.5, 45.0, 4.0, 5, 10_000, 300, True)
QUICK = Sizes(8, 8, 0.3, 2.0, 2.0, 1, 300, 20, False)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the suite runs")
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "bench" / "results",
        help="where report.md and latency.png go (default: bench/results)",
    )
    parser.add_argument("--transitions", type=int, help="latency transitions per cloud")
    parser.add_argument("--drain-events", type=int, help="events in each backlog drain")
    parser.add_argument("--idle-seconds", type=float, help="length of the idle window")
    parser.add_argument(
        "--no-pubsub", action="store_true", help="skip the drain to the Pub/Sub emulator"
    )
    return parser.parse_args(argv)


def sizes_of(args: argparse.Namespace) -> Sizes:
    base = QUICK if args.quick else FULL
    return Sizes(
        transitions=args.transitions or base.transitions,
        plain_azure_transitions=args.transitions or base.plain_azure_transitions,
        azure_spacing=base.azure_spacing,
        idle_seconds=args.idle_seconds or base.idle_seconds,
        idle_warmup=base.idle_warmup,
        startup_runs=base.startup_runs,
        drain_events=args.drain_events or base.drain_events,
        commit_samples=base.commit_samples,
        pubsub=base.pubsub and not args.no_pubsub,
    )


def step(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


async def start_receiver(module: str, workdir: Path) -> tuple[Proc, Receiver]:
    port = free_port()
    proc = await spawn(module.rsplit(".", 1)[-1], ["-m", module, str(port)], workdir)
    receiver = Receiver(port)
    await receiver.ready()
    return proc, receiver


async def run(sizes: Sizes, mode: str, workdir: Path) -> Results:
    results = Results(mode, load=[_load()], commit=_commit())
    began = time.monotonic()
    receiver_proc, receiver = await start_receiver("bench.receiver", workdir)
    plain_proc, plain = await start_receiver("bench.plain", workdir)
    try:
        step(f"latency: {sizes.transitions} GCE transitions")
        results.gce = await latency.gce(sizes.transitions, workdir, receiver)
        step(f"latency: {sizes.transitions} Azure transitions (1 s, 0.25 s, sample)")
        results.azure = await latency.azure(
            sizes.transitions, workdir, receiver, sizes.azure_spacing
        )
        aws_transitions = max(2, sizes.transitions // 2)
        step(f"latency: {aws_transitions} AWS transitions (1 s, 0.25 s)")
        results.aws = await aws.latency(aws_transitions, workdir, receiver)
        step(f"latency against plain http.server: {sizes.transitions} GCE transitions")
        results.gce_plain = await latency.gce(sizes.transitions, workdir, plain, plain=True)
        count = sizes.plain_azure_transitions
        step(f"latency against plain http.server: {count} Azure transitions")
        results.azure_plain = await latency.azure(
            count, workdir, plain, sizes.azure_spacing, plain=True
        )
        step(f"idle cost and footprint: {sizes.idle_seconds:g} s")
        results.idle = await idle.measure(sizes.idle_seconds, sizes.idle_warmup, workdir, receiver)
        step(f"start-up: {sizes.startup_runs} run(s) each")
        results.startup = await startup.measure(sizes.startup_runs, workdir, receiver)
        results.import_profile = startup.import_profile(with_sdks=False)
        results.import_profile_sdks = startup.import_profile(with_sdks=True)
        results.rss_profile = idle.rss_by_import(startup.RUN_PATH)
        step(f"spool commit and backlog drains: {sizes.drain_events} events")
        results.commit_ms = await drain.commit_latency(sizes.commit_samples)
        for mode_name in ("structured", "batch"):
            sink = {"type": "webhook", "url": receiver.url(f"drain-{mode_name}"), "mode": mode_name}
            results.drains.append(
                await drain.drain(f"webhook, {mode_name}", sink, sizes.drain_events)
            )
        results.drains.append(
            await drain.drain(
                PLAIN_DRAIN, webhook(plain.url("drain-plain"), "structured"), sizes.drain_events
            )
        )
        for label, prefix in ((PLAIN_LABEL, "drain"), (ANSWERING_LABEL, ANSWERED)):
            if label == ANSWERING_LABEL:
                results.drains.append(
                    await drain.drain(
                        ANSWERED_DRAIN,
                        webhook(plain.url(f"{ANSWERED}-bridge"), "structured"),
                        sizes.drain_events,
                    )
                )
            results.drains.append(
                await asyncio.to_thread(
                    drain.sync_client,
                    plain.url(f"{prefix}-sync-client"),
                    sizes.drain_events,
                    drain.yardstick(drain.SYNC_CLIENT, label),
                )
            )
            results.drains.append(
                await drain.client_alone(
                    plain.url(f"{prefix}-client-alone"),
                    sizes.drain_events,
                    drain.yardstick(drain.HTTP1_ALONE, label),
                )
            )
        if sizes.pubsub:
            outcome = await drain.pubsub(sizes.drain_events)
            if isinstance(outcome, str):
                results.skipped.append(f"Backlog drain to the Pub/Sub emulator: {outcome}")
            else:
                results.drains.append(outcome)
        else:
            results.skipped.append(
                "Backlog drain to the Pub/Sub emulator (quick mode or --no-pubsub)"
            )
        outcome = await drain.kafka(sizes.drain_events)
        if isinstance(outcome, str):
            results.skipped.append(f"Backlog drain to the Kafka mock cluster: {outcome}")
        else:
            results.drains.append(outcome)
        missed = [t.label for t in targets(results) if t.missed()]
        if any("Idle CPU" in label for label in missed):
            step("profiling the idle Azure bridge")
            results.idle_profile = await idle.profile_azure_poll(
                max(10.0, sizes.idle_seconds / 2), workdir, receiver
            )
        if any("drain, webhook (structured" in label for label in missed):
            step("profiling the structured webhook drain")
            sink = {"type": "webhook", "url": receiver.url("drain-profile")}
            results.drain_profile = [
                *await drain.drain_steps(
                    webhook(receiver.url("drain-steps")), min(2000, sizes.drain_events)
                ),
                "",
                *await drain.profile_drain(sink, min(2000, sizes.drain_events)),
            ]
        if any(f"{PLAIN_LABEL} receiver" in label for label in missed):
            step("profiling the structured webhook drain to the plain receiver")
            results.drain_profile_plain = [
                *await drain.drain_steps(
                    webhook(plain.url("drain-plain-steps")), min(2000, sizes.drain_events)
                ),
                "",
                *await drain.profile_drain(
                    webhook(plain.url("drain-plain-profile")), min(2000, sizes.drain_events)
                ),
            ]
        reruns: Reruns = {}
        for target in targets(results):
            if target.missed() and "latency" in target.label:
                step(f"profiling: {target.label}")
                at_plain = PLAIN_LABEL in target.label
                results.latency_profiles[target.label] = await latency_profile(
                    target.label, results, workdir, plain if at_plain else receiver,
                    min(60, sizes.transitions), reruns,
                )  # fmt: skip
    finally:
        for handle, proc in ((receiver, receiver_proc), (plain, plain_proc)):
            await handle.close()
            await proc.stop()
    results.seconds = time.monotonic() - began
    results.load.append(_load())
    return results


def _commit() -> str | None:
    """The checkout's commit, marked when tracked files differ from it (a report must say
    what it measured)."""
    import subprocess

    from bridge.infra.buildinfo import git_commit

    found = git_commit(ROOT)
    if found is None:
        return None
    changed = subprocess.run(
        ["git", "-C", str(ROOT), "diff", "--quiet", "HEAD"], capture_output=True, check=False
    )
    return f"{found} + changes" if changed.returncode else found


def _load() -> float:
    """The host's 1-minute load average (psutil emulates it where the system has none)."""
    try:
        return float(psutil.getloadavg()[0])
    except OSError:
        return float("nan")


#: Latency reruns with the steps timed, by (GCE?, plain servers?): one serves every target
#: of that run (an Azure rerun times the 1 s and the 0.25 s bridge at once).
Reruns = dict[tuple[bool, bool], tuple[list[Series], Path]]


async def latency_profile(
    label: str,
    results: Results,
    workdir: Path,
    receiver: Receiver,
    transitions: int,
    reruns: Reruns,
) -> list[str]:
    """What a missed latency costs: the slowest transitions of the measured run, then where
    the bridge's part goes, step by step, over a rerun with the steps timed (`bench.spans`:
    the part is mostly waiting, a thread hand-off, an fsync, the receiver, which a CPU
    profile does not show)."""
    key = _series_key(label)
    gce = key == "gce"
    plain = PLAIN_LABEL in label
    if plain:
        measured = results.gce_plain if gce else results.azure_plain
    else:
        measured = results.gce if gce else results.azure
    lines = worst(series) if (series := _bridge_series(measured, key)) is not None else []
    if (gce, plain) not in reruns:
        # its own spools, logs and step timings
        name = f"{'gce' if gce else 'azure'}{'-plain' if plain else ''}"
        directory = workdir / f"latency-profile-{name}"
        directory.mkdir(exist_ok=True)
        if gce:
            rerun = await latency.gce(transitions, directory, receiver, directory, plain=plain)
        else:
            rerun = await latency.azure(
                transitions, directory, receiver, 0.5, directory, plain=plain
            )
        reruns[(gce, plain)] = (rerun, directory)
    rerun, directory = reruns[(gce, plain)]
    again = _bridge_series(rerun, key)
    spans = latency.spans_file(directory, key)
    if again is None or spans is None:
        return [*lines, "(the rerun measured nothing)"]
    return [*lines, "", f"a rerun of {transitions} transitions:", *breakdown(again, spans)]


def _bridge_series(measured: list[Series], key: str) -> Series | None:
    return next((s for s in measured if not s.baseline and _POLL[key] in s.name), None)


_POLL = {"gce": "GCE long poll", "azure-1s": "Azure 1 s poll", "azure-0.25s": "Azure 0.25 s poll"}


def _series_key(label: str) -> str:
    """Which watcher a latency target's label speaks of."""
    if label.startswith("GCE"):
        return "gce"
    return "azure-1s" if "1 s" in label else "azure-0.25s"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = sizes_of(args)
    mode = "quick (tiny sizes, figures not meaningful)" if args.quick else "full"
    workdir = Path(tempfile.mkdtemp(prefix="bench-"))
    try:
        results = asyncio.run(run(sizes, mode, workdir))
    except BaseException:
        print(f"[bench] failed; the processes' logs are in {workdir}", file=sys.stderr)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    report = render(results)
    (args.out / "report.md").write_text(report)
    plot(results, args.out / "latency.png")
    print(report)
    step(f"wrote {args.out / 'report.md'} and {args.out / 'latency.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
