"""`python -m bench [--quick] [--out DIR]`: run every benchmark, write report.md, results.json
(the figures, for `python -m bench.compare`) and latency.png.

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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench import aws, drain, idle, latency, startup
from bench.plain import ANSWERED
from bench.procs import ROOT, Proc, commit, spawn, webhook
from bench.receiver import Receiver
from bench.report import (
    ANSWERED_DRAIN,
    ANSWERING_LABEL,
    PLAIN_DRAIN,
    PLAIN_LABEL,
    Results,
    dump,
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
    parser.add_argument(
        "--parts",
        type=_parts,
        default=list(PARTS),
        metavar="NAME,...",
        help=f"run only these parts, in this order (default: all of {', '.join(PARTS)})",
    )
    parser.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help="write only the figures, as JSON, to FILE: no report, plot or profiles "
        "(what `python -m bench.compare` reads)",
    )
    return parser.parse_args(argv)


def _parts(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in PARTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown part(s) {', '.join(unknown) or '(none given)'}; the parts: {', '.join(PARTS)}"
        )
    return names


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


@dataclass
class Bench:
    """What every part of a run shares: its sizes, its directory, the two receivers (ours and
    the plain `http.server` one), and the results it fills in."""

    sizes: Sizes
    workdir: Path
    receiver: Receiver
    plain: Receiver
    results: Results
    #: Whether the parts may add profiles (import times, RSS by import) that only the
    #: report's "what costs it" section reads; a comparison needs only the figures.
    profiles: bool = True


async def _gce(b: Bench) -> None:
    step(f"latency: {b.sizes.transitions} GCE transitions")
    b.results.gce = await latency.gce(b.sizes.transitions, b.workdir, b.receiver)


async def _azure(b: Bench) -> None:
    step(f"latency: {b.sizes.transitions} Azure transitions (1 s, 0.25 s, sample)")
    b.results.azure = await latency.azure(
        b.sizes.transitions, b.workdir, b.receiver, b.sizes.azure_spacing
    )


async def _aws(b: Bench) -> None:
    aws_transitions = max(2, b.sizes.transitions // 2)
    step(f"latency: {aws_transitions} AWS transitions (1 s, 0.25 s)")
    b.results.aws = await aws.latency(aws_transitions, b.workdir, b.receiver)


async def _gce_plain(b: Bench) -> None:
    step(f"latency against plain http.server: {b.sizes.transitions} GCE transitions")
    b.results.gce_plain = await latency.gce(b.sizes.transitions, b.workdir, b.plain, plain=True)


async def _azure_plain(b: Bench) -> None:
    count = b.sizes.plain_azure_transitions
    step(f"latency against plain http.server: {count} Azure transitions")
    b.results.azure_plain = await latency.azure(
        count, b.workdir, b.plain, b.sizes.azure_spacing, plain=True
    )


async def _idle(b: Bench) -> None:
    step(f"idle cost and footprint: {b.sizes.idle_seconds:g} s")
    b.results.idle = await idle.measure(
        b.sizes.idle_seconds, b.sizes.idle_warmup, b.workdir, b.receiver
    )


async def _startup(b: Bench) -> None:
    step(f"start-up: {b.sizes.startup_runs} run(s) each")
    b.results.startup = await startup.measure(b.sizes.startup_runs, b.workdir, b.receiver)
    if b.profiles:
        b.results.import_profile = startup.import_profile(with_sdks=False)
        b.results.import_profile_sdks = startup.import_profile(with_sdks=True)
        b.results.rss_profile = idle.rss_by_import(startup.RUN_PATH)


async def _commit_latency(b: Bench) -> None:
    step(f"spool commit: {b.sizes.commit_samples} notices")
    b.results.commit_ms = await drain.commit_latency(b.sizes.commit_samples)
    b.results.disk_ms = await asyncio.to_thread(drain.disk_floor, b.sizes.commit_samples)


async def _webhook_drains(b: Bench) -> None:
    step(f"backlog drains to the webhook receiver: {b.sizes.drain_events} events")
    for mode_name in ("structured", "batch"):
        sink = {"type": "webhook", "url": b.receiver.url(f"drain-{mode_name}"), "mode": mode_name}
        b.results.drains.append(
            await drain.drain(f"webhook, {mode_name}", sink, b.sizes.drain_events)
        )


async def _plain_drains(b: Bench) -> None:
    """The drains into the plain receivers, each next to its yardsticks."""
    events, plain = b.sizes.drain_events, b.plain
    step(f"backlog drains to the plain receivers: {events} events")
    b.results.drains.append(
        await drain.drain(PLAIN_DRAIN, webhook(plain.url("drain-plain"), "structured"), events)
    )
    for label, prefix in ((PLAIN_LABEL, "drain"), (ANSWERING_LABEL, ANSWERED)):
        if label == ANSWERING_LABEL:
            b.results.drains.append(
                await drain.drain(
                    ANSWERED_DRAIN,
                    webhook(plain.url(f"{ANSWERED}-bridge"), "structured"),
                    events,
                )
            )
        b.results.drains.append(
            await asyncio.to_thread(
                drain.sync_client,
                plain.url(f"{prefix}-sync-client"),
                events,
                drain.yardstick(drain.SYNC_CLIENT, label),
            )
        )
        b.results.drains.append(
            await drain.client_alone(
                plain.url(f"{prefix}-client-alone"),
                events,
                drain.yardstick(drain.HTTP1_ALONE, label),
            )
        )


async def _pubsub(b: Bench) -> None:
    if not b.sizes.pubsub:
        b.results.skipped.append(
            "Backlog drain to the Pub/Sub emulator (quick mode or --no-pubsub)"
        )
        return
    await _drain_to(b, "the Pub/Sub emulator", drain.pubsub)


async def _kafka(b: Bench) -> None:
    await _drain_to(b, "the Kafka mock cluster", drain.kafka)


async def _drain_to(
    b: Bench, where: str, drain_into: Callable[[int], Awaitable[drain.Drain | str]]
) -> None:
    """A drain into a local server that may be missing here (its reason is then reported)."""
    step(f"backlog drain to {where}: {b.sizes.drain_events} events")
    outcome = await drain_into(b.sizes.drain_events)
    if isinstance(outcome, str):
        b.results.skipped.append(f"Backlog drain to {where}: {outcome}")
    else:
        b.results.drains.append(outcome)


#: The parts of a run, in the order a full run plays them (`--parts` picks some; each
#: fills in its own fields of `Results`, so a comparison can run them one by one).
PARTS: dict[str, Callable[[Bench], Awaitable[None]]] = {
    "gce": _gce,
    "azure": _azure,
    "aws": _aws,
    "gce-plain": _gce_plain,
    "azure-plain": _azure_plain,
    "idle": _idle,
    "startup": _startup,
    "commit": _commit_latency,
    "drain-webhook": _webhook_drains,
    "drain-plain": _plain_drains,
    "pubsub": _pubsub,
    "kafka": _kafka,
}


async def run(
    sizes: Sizes,
    mode: str,
    workdir: Path,
    parts: Sequence[str] = tuple(PARTS),
    profiles: bool = True,
) -> Results:
    results = Results(mode, load=[_load()], commit=commit())
    _compile_bytecode()
    began = time.monotonic()
    receiver_proc, receiver = await start_receiver("bench.receiver", workdir)
    plain_proc, plain = await start_receiver("bench.plain", workdir)
    bench = Bench(sizes, workdir, receiver, plain, results, profiles)
    try:
        for name in parts:
            await PARTS[name](bench)
        if profiles:
            await _profile_misses(bench)
    finally:
        for handle, proc in ((receiver, receiver_proc), (plain, plain_proc)):
            await handle.close()
            await proc.stop()
    results.seconds = time.monotonic() - began
    results.load.append(_load())
    return results


async def _profile_misses(b: Bench) -> None:
    """Profiles for the targets the run missed: what the report's last section shows."""
    sizes, workdir, receiver, plain, results = b.sizes, b.workdir, b.receiver, b.plain, b.results
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


def _compile_bytecode() -> None:
    """Compile the checkout's modules to bytecode before any process is timed, as pip does
    when it installs a package: a process that finds no `.pyc` compiles every module it
    imports from source, which costs start-up time and raises its peak memory (about
    0.6 MiB of the idle bridge's), and whether the `.pyc` files exist would depend on
    earlier runs and on PYTHONDONTWRITEBYTECODE, not on the code measured."""
    import compileall

    for package in ("bridge", "sinks", "bench", "tests"):
        compileall.compile_dir(ROOT / package, quiet=2, workers=1)


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


def measured_tree() -> Path:
    """The checkout whose `bridge` and `sinks` this process imports: it must be the one this
    `bench` comes from (its processes run with that checkout first on PYTHONPATH), or the
    figures would belong to other code than the report names (an editable install of
    another checkout, a stray PYTHONPATH)."""
    import bridge
    import sinks

    for package in (bridge, sinks):
        where = Path(package.__file__ or "").resolve()
        if not where.is_relative_to(ROOT):
            raise SystemExit(
                f"bench: {package.__name__} is imported from {where.parent}, not from this "
                f"benchmark's checkout {ROOT}: run it from {ROOT} (or with PYTHONPATH={ROOT})"
            )
    return ROOT


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    measured_tree()
    sizes = sizes_of(args)
    mode = "quick (tiny sizes, figures not meaningful)" if args.quick else "full"
    workdir = Path(tempfile.mkdtemp(prefix="bench-"))
    try:
        results = asyncio.run(run(sizes, mode, workdir, args.parts, profiles=args.json is None))
    except BaseException:
        print(f"[bench] failed; the processes' logs are in {workdir}", file=sys.stderr)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(dump(results))
        step(f"wrote {args.json}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    report = render(results)
    (args.out / "report.md").write_text(report)
    (args.out / "results.json").write_text(dump(results))
    plot(results, args.out / "latency.png")
    print(report)
    step(f"wrote {args.out / 'report.md'}, results.json and latency.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
