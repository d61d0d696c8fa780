"""`python -m bench.fleet_retention [--backlog N] [--smoke]`: a retention pass over a large
backlog must never stall ingest or reads (issue 33, "A store that can run for years").

For SQLite and PostgreSQL in turn (`bench.fleet_ingest.stores`: a file, a throwaway server):

1. A backlog of `--backlog` events received 500 days ago (`bench.fleet_workload`'s audit log,
   pre-filled by `bench.fleet_prefill` with the receive time backdated; on PostgreSQL into
   their month's partition, as a store running for years has them): heartbeats past the
   7 days they are kept, the rest past the 400 days of the audit log, and every instance
   silent long enough to retire.
2. Baseline: for `--seconds`, an ingest loop (batches of 10 new heartbeats, one after
   another: `Store.ingest`, a commit each) and a reader (one instance's notices, the first
   page of instances, the counts, in turn), each call timed.
3. The same loops while `bridge.fleet.retention.Pruner.run_pass` (the default policy:
   transactions of at most 1,000 rows, smaller when one holds the writer over 50 ms, 50 ms
   apart) works off the backlog, until the pass ends:
   ingest and read latency during it against the baseline, the pass's duration and what
   it removed.

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
    report: PruneReport
    events_after: int


async def loops(store: Store, workload: Workload, until: Callable[[], bool], first: int) -> Loops:
    """Ingest and read, each in a loop, timed, until `until()`."""
    found = Loops([], [])
    name = workload.in_force_vm(0).name
    sequence = first

    async def ingest() -> None:
        nonlocal sequence
        while not until():
            bodies = workload.heartbeats(INGEST_BATCH, first_sequence=sequence)
            sequence += INGEST_BATCH
            accepted = [Accepted(contract.from_cloudevent(b), b) for b in bodies]
            began = time.perf_counter()
            await store.ingest(Batch(ingest="http", received_at=time.time(), accepted=accepted))
            found.ingest.append((time.perf_counter() - began) * 1000)

    reads: list[Callable[[], Awaitable[Any]]] = [
        lambda: store.notices(NoticeFilter(instance=name)),
        lambda: store.instance_page(InstanceQuery(limit=100, now=time.time())),
        store.counts,
    ]

    async def read() -> None:
        n = 0
        while not until():
            began = time.perf_counter()
            await reads[n % len(reads)]()
            found.reads.append((time.perf_counter() - began) * 1000)
            n += 1

    await asyncio.gather(ingest(), read())
    return found


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
        log(f"{name}: baseline, {seconds:g} s")
        deadline = time.monotonic() + seconds
        baseline = await loops(store, workload, lambda: time.monotonic() > deadline, 5_000_000)
        log(f"{name}: the same during a retention pass over the backlog")
        assert isinstance(store, Prunable)  # both stores are
        pruner = Pruner(store, FleetRetention())
        pruning = asyncio.create_task(pruner.run_pass())
        began = time.perf_counter()
        during = await loops(store, workload, pruning.done, 6_000_000)
        report = await pruning
        pass_seconds = time.perf_counter() - began
        events_after = (await store.counts())["events"]
    finally:
        await store.close()
    return StoreResult(name, backlog, fill, baseline, during, pass_seconds, report, events_after)


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
        "at most 1,000 rows, smaller when one holds the writer over 50 ms, 50 ms apart); "
        "ingest is batches of 10 new heartbeats one after another, reads one instance's "
        "notices, a page of 100 instances and the counts in turn, in the store's process as "
        "in the fleet service.",
        "",
    ]
    for r in results:
        rep = r.report
        lines += [
            f"## {r.store}",
            "",
            f"A backlog of {r.backlog:,} events received 500 days ago ({r.fill_seconds:.0f} s "
            f"to pre-fill). The pass took {r.pass_seconds:.1f} s and removed "
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


async def run(backlog: int, seconds: float) -> list[StoreResult]:
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-retention-") as tmp:
        async with stores(Path(tmp)) as available:
            for name, new_url in available:
                results.append(await measure(name, new_url(), backlog, seconds))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_retention", description=__doc__)
    parser.add_argument("--backlog", type=int, default=100_000, help="events to prune")
    parser.add_argument("--seconds", type=float, default=10.0, help="baseline length")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it runs")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    backlog, seconds = (3_000, 1.0) if args.smoke else (args.backlog, args.seconds)
    words = sys.argv[1:] if argv is None else argv
    first_load = psutil.getloadavg()[0]
    results = asyncio.run(run(backlog, seconds))
    command = " ".join(["python -m bench.fleet_retention", *words])
    report = render(results, command, (first_load, psutil.getloadavg()[0]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fleet-retention.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
