"""`python -m bench.fleet_retention [--backlog N] [--stores ...] [--smoke]`: a retention pass
over a large backlog must never stall ingest or reads (issue 33, "A store that can run for
years").

For SQLite and PostgreSQL in turn (`bench.fleet_ingest.stores`: a file, a throwaway server):

1. A backlog of `--backlog` events received 500 days ago (`bench.fleet_workload`'s audit log,
   pre-filled by `bench.fleet_prefill` with the receive time backdated; on PostgreSQL into
   their month's partition, as a store running for years has them): heartbeats past the
   7 days they are kept, the rest past the 400 days of the audit log, and every instance
   silent long enough to retire.
2. An ingest loop (batches of 10 new heartbeats, one after another: `Store.ingest`, a
   commit each) and a reader (one instance's notices, the first page of instances, the
   counts, in turn), each call timed, while `bridge.fleet.retention.Pruner.run_pass` (the
   default policy) works off the backlog until the pass ends, in windows of `--window`
   seconds that alternate: the pruner held between two batches, then let go. So "without"
   and "during" are measured in turns in one run, under the same load of a shared host
   (a first "without" window before the pass starts); a call is counted in the window it
   began in, except in the first tenth of a second of each (a batch may still end then).

Everything runs in this process on the store's own threads, as in `maintenance-bridge fleet`
(the pruner, the sources and the API share the store's writer and its readers). Writes
`fleet-retention.md` in `--out` (default bench/results).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import psutil

from bench.fleet_ingest import stores
from bench.fleet_prefill import prefill
from bench.fleet_workload import Workload
from bench.procs import ROOT, commit
from bench.stats import Summary, summarize
from bridge import contract
from bridge.fleet import partitions
from bridge.fleet.retention import DAY, FleetRetention, Prunable, Pruner, PruneReport
from bridge.fleet.service import build_store
from bridge.fleet.store import Accepted, Batch, InstanceQuery, NoticeFilter, Store

AGE: Final = 500 * DAY
INGEST_BATCH: Final = 10


def log(text: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[bench.fleet_retention {stamp}] {text}", file=sys.stderr, flush=True)


@dataclass
class Loops:
    ingest: list[float]  # ms per Store.ingest
    reads: list[float]  # ms per read


@dataclass
class StoreResult:
    store: str
    backlog: int
    fill_seconds: float
    baseline: Loops
    during: Loops
    pass_seconds: float
    windows: int
    report: PruneReport
    events_after: int


#: Seconds at the start of a window whose calls count in neither (a batch may still end).
SETTLE: Final = 0.1


class Windows:
    """Alternating windows: the pruner held (between two batches) or let go."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.pruning = False
        self.began = time.monotonic()
        self.count = 0
        self.gate = asyncio.Event()
        #: (start, end) of each window the pruner was let go in (monotonic seconds).
        self.let_go: list[tuple[float, float]] = []

    def arm(self) -> Loops | None:
        """The window a call beginning now counts in (None: settling)."""
        return None if time.monotonic() - self.began < SETTLE else self.current

    async def pruner_sleep(self, seconds: float) -> None:
        """The pruner's pause between batches: it waits here while its window is closed."""
        await asyncio.sleep(seconds)
        await self.gate.wait()

    async def alternate(self, done: Callable[[], bool]) -> None:
        while not done():
            await asyncio.sleep(self.seconds)
            self.pruning = not self.pruning
            self.current = self.during if self.pruning else self.baseline
            now = time.monotonic()
            if not self.pruning:
                self.let_go.append((self.began, now))
            self.began = now
            self.count += self.pruning
            if self.pruning:
                self.gate.set()
            else:
                self.gate.clear()

    def pruned(self, finished: float) -> float:
        """Seconds the pruner was let go before `finished` (monotonic)."""
        spans = [*self.let_go, *([(self.began, finished)] if self.pruning else [])]
        return sum(max(0.0, min(end, finished) - start) for start, end in spans)

    baseline: Loops
    during: Loops
    current: Loops


async def loops(
    store: Store, workload: Workload, until: Callable[[], bool], first: int, windows: Windows
) -> None:
    """Ingest and read, each in a loop, timed, until `until()`; each call counted in the
    window it began in."""
    name = workload.in_force_vm(0).name
    sequence = first

    async def ingest() -> None:
        nonlocal sequence
        while not until():
            bodies = workload.heartbeats(INGEST_BATCH, first_sequence=sequence)
            sequence += INGEST_BATCH
            accepted = [Accepted(contract.from_cloudevent(b), b) for b in bodies]
            arm, began = windows.arm(), time.perf_counter()
            await store.ingest(Batch(ingest="http", received_at=time.time(), accepted=accepted))
            if arm is not None:
                arm.ingest.append((time.perf_counter() - began) * 1000)

    reads: list[Callable[[], Awaitable[Any]]] = [
        lambda: store.notices(NoticeFilter(instance=name)),
        lambda: store.instance_page(InstanceQuery(limit=100, now=time.time())),
        store.counts,
    ]

    async def read() -> None:
        n = 0
        while not until():
            arm, began = windows.arm(), time.perf_counter()
            await reads[n % len(reads)]()
            if arm is not None:
                arm.reads.append((time.perf_counter() - began) * 1000)
            n += 1

    await asyncio.gather(ingest(), read())


async def measure(name: str, url: str, backlog: int, seconds: float) -> StoreResult:
    workload = Workload(max(100, backlog // 10), backlog)
    old = time.time() - AGE
    store = build_store(url)
    await store.open()
    if name == "PostgreSQL":  # the backlog's month has its partition, as it had back then
        await store.transaction(lambda db: partitions.ensure_months(db, [old, time.time()]))
    await store.close()
    log(f"{name}: a backlog of {backlog:,} events received 500 days ago")
    (fill,) = await prefill([url], workload.history(), received_at=old)
    store = build_store(url)
    await store.open()
    try:
        log(f"{name}: a retention pass over the backlog, held and let go every {seconds:g} s")
        assert isinstance(store, Prunable)  # both stores are
        windows = Windows(seconds)
        windows.baseline, windows.during = Loops([], []), Loops([], [])
        windows.current = windows.baseline
        pruner = Pruner(store, FleetRetention(), sleep=windows.pruner_sleep)
        finished = 0.0

        async def pass_when_let_go() -> PruneReport:
            nonlocal finished
            await windows.gate.wait()
            try:
                return await pruner.run_pass()
            finally:
                finished = time.monotonic()

        pruning = asyncio.create_task(pass_when_let_go())
        await asyncio.gather(
            windows.alternate(pruning.done),
            loops(store, workload, pruning.done, 6_000_000, windows),
        )
        report = await pruning
        pass_seconds = windows.pruned(finished)  # the windows it was held are not its time
        events_after = (await store.counts())["events"]
    finally:
        await store.close()
    return StoreResult(
        name,
        backlog,
        fill,
        windows.baseline,
        windows.during,
        pass_seconds,
        windows.count,
        report,
        events_after,
    )


def _row(what: str, base: Summary, during: Summary) -> str:
    return (
        f"| {what} | {base.p50:.1f} / {base.p99:.1f} / {base.max:.0f} (n={base.count:,}) | "
        f"{during.p50:.1f} / {during.p99:.1f} / {during.max:.0f} (n={during.count:,}) |"
    )


def render(results: list[StoreResult], command: str, loads: tuple[float, float]) -> str:
    lines = [
        "# Retention never stalls ingest: a pass over a large backlog, timed from the side",
        "",
        f"`{command}`. Commit measured: {commit()}. Host: {os.cpu_count()} CPUs, load "
        f"average {loads[0]:.1f} at the start and {loads[1]:.1f} at the end. The default "
        "policy (`[fleet.retention]`: 400 days of events, 7 of heartbeats, transactions of "
        "at most 1,000 rows, starting at 100, smaller when one holds the writer over 20 ms "
        "with its commit, 50 ms apart); ingest is batches of 10 new heartbeats one after "
        "another, reads one instance's notices, a page of 100 instances and the counts in "
        "turn, in the store's process as in the fleet service. The pruner is held and let "
        'go in alternate windows until its pass ends: "without" and "during" are '
        "measured in turns, under the same load.",
        "",
    ]
    for r in results:
        rep = r.report
        lines += [
            f"## {r.store}",
            "",
            f"A backlog of {r.backlog:,} events received 500 days ago ({r.fill_seconds:.0f} s "
            f"to pre-fill). The pass took {r.pass_seconds:.1f} s (let go in {r.windows} "
            "windows) and removed "
            f"{rep.heartbeats:,} heartbeats, {rep.events:,} other events row by row, "
            f"{rep.partitions} month partition(s) whole, {rep.keys:,} de-duplication keys; "
            f"retired {rep.retired:,} instances. Events left: {r.events_after:,} (what the "
            "loops ingested).",
            "",
            "| ms: p50 / p99 / max | without pruning | during the pass |",
            "| --- | ---: | ---: |",
            _row(
                f"ingest, a batch of {INGEST_BATCH} committed",
                summarize(r.baseline.ingest),
                summarize(r.during.ingest),
            ),
            _row("reads", summarize(r.baseline.reads), summarize(r.during.reads)),
            "",
        ]
    return "\n".join(lines)


async def run(backlog: int, seconds: float, kinds: tuple[str, ...]) -> list[StoreResult]:
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-retention-") as tmp:
        async with stores(Path(tmp), postgresql="postgresql" in kinds) as available:
            for name, new_url in available:
                if name.lower() not in kinds:
                    continue
                results.append(await measure(name, new_url(), backlog, seconds))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_retention", description=__doc__)
    parser.add_argument("--backlog", type=int, default=100_000, help="events to prune")
    parser.add_argument(
        "--window", type=float, default=2.0, help="seconds the pruner is held, then let go"
    )
    parser.add_argument(
        "--stores",
        default="sqlite,postgresql",
        help="comma-separated: sqlite, postgresql (default both)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it runs")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    backlog, seconds = (3_000, 0.5) if args.smoke else (args.backlog, args.window)
    kinds = tuple(k.strip().lower() for k in args.stores.split(",") if k.strip())
    words = sys.argv[1:] if argv is None else argv
    first_load = psutil.getloadavg()[0]
    results = asyncio.run(run(backlog, seconds, kinds))
    command = " ".join(["python -m bench.fleet_retention", *words])
    report = render(results, command, (first_load, psutil.getloadavg()[0]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fleet-retention.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
