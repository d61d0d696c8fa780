"""`python -m bench.fleet_replicas [--instances N] [--events N] [--smoke]`: what each fleet
replica and PostgreSQL cost, two replicas on one database (issue 33, "Several replicas").

On 2 cores shared with PostgreSQL and the load, two replicas cannot show a speed-up; what
they can show is the cost of the work, from which a deployment is sized. So this measures
CPU seconds, not rates:

1. A throwaway PostgreSQL (`tests.fleet.postgres_server`: the machine's binaries, `fsync=off`)
   pre-filled with the workload's audit log (`bench.fleet_workload`, `bench.fleet_prefill`).
2. Two `maintenance-bridge fleet` processes on it, each its own process and port with a
   signed `http` source and a read credential (as `bench.fleet_scale` starts one).
3. Ingest, split over the two: one-event signed posts (32 senders per replica, a 503 is
   retried after its Retry-After as the sink does), then HTTP batches of 100 (the webhook
   sink's batch mode). Every event is new.
4. Reads, split over the two: the main API reads in turn (`bench.fleet_scale.read_paths`,
   the page's renders left out), 4 concurrent readers per replica.
5. For each phase, the CPU seconds (user + system) each replica process used, and
   PostgreSQL's: the postmaster and all its children (backends, WAL writer,
   checkpointer...), those that ended included (`psutil`), per 1,000 events or reads.
6. Every event stored once: the audit log holds exactly the pre-fill plus every event
   posted (`COUNT(*)` and `COUNT(DISTINCT (source, id))` on the server).

Writes `fleet-replicas.md` in `--out` (default bench/results). docs/fleet.md's scaling guide
is computed from these figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import aiohttp
import psutil

from bench.fleet import SECRET
from bench.fleet import post_batches as post_batches_of_100
from bench.fleet_prefill import prefill
from bench.fleet_scale import READ_TOKEN, fleet_process, read_paths, signed
from bench.fleet_workload import Workload
from bench.procs import ROOT, Proc, commit
from bridge.transports import webhook_signing as signing
from tests.support import free_port, running_as_root

REPLICAS: Final = 2
SENDERS_PER_REPLICA: Final = 32
READERS_PER_REPLICA: Final = 4
BATCH: Final = 100


def log(text: str) -> None:
    print(f"[bench.fleet_replicas {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Sizes:
    instances: int
    events: int  # the pre-filled audit log
    posts: int  # one-event posts, over both replicas
    batch_events: int  # events in batches of 100, over both replicas
    reads: int  # reads, over both replicas


def sizes_of(instances: int, events: int, smoke: bool) -> Sizes:
    if smoke:
        return Sizes(instances, events, 200, 1_000, 100)
    return Sizes(instances, events, 6_000, 50_000, 3_000)


# -- CPU accounting ---------------------------------------------------------------------------


def process_cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def postgres_cpu(postmaster: int) -> float:
    """The postmaster's CPU seconds, its live children's and those of children it reaped
    (a backend whose connection closed)."""
    root = psutil.Process(postmaster)
    times = root.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in root.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            child_times = child.cpu_times()
            total += child_times.user + child_times.system
    return float(total)


@dataclass
class Phase:
    """One phase's work and the CPU seconds each process spent on it."""

    name: str
    unit: str  # "events" or "reads"
    done: list[int]  # per replica
    replica_cpu: list[float]
    postgres_cpu: float
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.done)

    def per_thousand(self, cpu: float, done: int) -> float:
        return cpu / done * 1000 if done else float("nan")


async def measured(
    name: str,
    unit: str,
    replicas: list[Proc],
    postmaster: int,
    work: Callable[[], Awaitable[list[int]]],
) -> Phase:
    """Run `work` (which returns what each replica did) and take each process's CPU."""
    await asyncio.sleep(1.0)  # what the last phase left (group commits, pool) settles
    before = [process_cpu(p.pid) for p in replicas]
    pg_before = postgres_cpu(postmaster)
    began = time.perf_counter()
    done = await work()
    seconds = time.perf_counter() - began
    await asyncio.sleep(0.5)  # answers sent; the last commits' background work counted
    after = [process_cpu(p.pid) for p in replicas]
    return Phase(
        name,
        unit,
        done,
        [b - a for a, b in zip(before, after, strict=True)],
        postgres_cpu(postmaster) - pg_before,
        seconds,
    )


# -- the load ---------------------------------------------------------------------------------


async def one_event_posts(urls: list[str], bodies: list[bytes]) -> list[int]:
    """Each body its own signed POST, `SENDERS_PER_REPLICA` senders per replica, a 503
    retried after its Retry-After (capped at 2 s) as the sink does. Each post is signed as
    it is sent (a signature's timestamp must be recent), and anything but 2xx or 503 fails
    the run."""
    key = signing.standard_key(SECRET)
    shares = [bodies[n :: len(urls)] for n in range(len(urls))]
    timeout = aiohttp.ClientTimeout(total=120)

    async def replica(url: str, share: list[bytes]) -> None:
        queue = iter(share)
        connector = aiohttp.TCPConnector(limit=SENDERS_PER_REPLICA)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

            async def sender() -> None:
                for body in queue:
                    while True:
                        headers = signed(body, key)
                        async with http.post(url + "/v1/events", data=body, headers=headers) as a:
                            text = await a.read()
                            retry_after = a.headers.get("Retry-After")
                        if a.status == 503:
                            await asyncio.sleep(min(2.0, float(retry_after or 1)))
                            continue
                        if a.status >= 300:
                            raise RuntimeError(f"a one-event post answered {a.status}: {text!r}")
                        break

            await asyncio.gather(*(sender() for _ in range(SENDERS_PER_REPLICA)))

    await asyncio.gather(*(replica(u, share) for u, share in zip(urls, shares, strict=True)))
    return [len(share) for share in shares]


async def batches(urls: list[str], bodies: list[bytes]) -> list[int]:
    groups = [bodies[i : i + BATCH] for i in range(0, len(bodies), BATCH)]
    shares = [groups[n :: len(urls)] for n in range(len(urls))]
    await asyncio.gather(
        *(
            post_batches_of_100(url, [(group, {}) for group in share], sum(map(len, share)))
            for url, share in zip(urls, shares, strict=True)
        )
    )
    return [sum(map(len, share)) for share in shares]


async def reads(urls: list[str], paths: list[str], count: int) -> list[int]:
    headers = {"Authorization": f"Bearer {READ_TOKEN}"}
    done = [0] * len(urls)
    per_replica = count // len(urls)

    async def replica(index: int, url: str) -> None:
        queue = iter(range(per_replica))
        connector = aiohttp.TCPConnector(limit=READERS_PER_REPLICA)
        async with aiohttp.ClientSession(headers=headers, connector=connector) as http:

            async def reader() -> None:
                for n in queue:
                    async with http.get(url + paths[n % len(paths)]) as answer:
                        await answer.read()
                        if answer.status != 200:
                            raise RuntimeError(f"{paths[n % len(paths)]}: {answer.status}")
                    done[index] += 1

            await asyncio.gather(*(reader() for _ in range(READERS_PER_REPLICA)))

    await asyncio.gather(*(replica(n, url) for n, url in enumerate(urls)))
    return done


# -- PostgreSQL -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def postgres() -> AsyncIterator[tuple[str, int]]:
    """A throwaway server: (the URL of a new database, the postmaster's pid)."""
    from tests.fleet.postgres_server import PostgresServer, find_bindir

    bindir = find_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL's binaries are missing: apt-get install postgresql")
    directory = Path(tempfile.mkdtemp(prefix="bench-replicas-pg-"))  # `nobody` reaches it
    if running_as_root():
        shutil.chown(directory, "nobody")
    server = PostgresServer(bindir, directory, free_port())
    await asyncio.to_thread(server.start)
    try:
        pid = int((directory / "data" / "postmaster.pid").read_text().split()[0])
        yield await asyncio.to_thread(server.create_database), pid
    finally:
        await asyncio.to_thread(server.stop)
        shutil.rmtree(directory, ignore_errors=True)


async def stored_once(url: str) -> tuple[int, int]:
    """(rows of the audit log, distinct (source, id) among them), asked of the server."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url) as connection:
        cursor = await connection.execute(
            "SELECT COUNT(*), COUNT(DISTINCT (source, id)) FROM events"
        )
        row = await cursor.fetchone()
        assert row is not None
        return int(row[0]), int(row[1])


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Result:
    sizes: Sizes
    phases: list[Phase]
    stored: tuple[int, int]
    expected: int
    fill_seconds: float
    minutes: float


async def run(sizes: Sizes, workdir: Path) -> Result:
    began = time.monotonic()
    workload = Workload(sizes.instances, sizes.events)
    async with postgres() as (url, postmaster):
        log(f"pre-filling {sizes.events:,} events of {sizes.instances:,} VMs")
        (fill,) = await prefill([url], workload.history())
        async with contextlib.AsyncExitStack() as stack:
            replicas = [
                await stack.enter_async_context(fleet_process(workdir, url, f"replica-{n}"))
                for n in range(REPLICAS)
            ]
            urls = [u for u, _ in replicas]
            procs = [p for _, p in replicas]
            phases = []
            posts = workload.heartbeats(sizes.posts, first_sequence=2_000_000)
            log(f"one-event posts: {sizes.posts:,} over {REPLICAS} replicas")
            phases.append(
                await measured(
                    "one-event signed posts",
                    "events",
                    procs,
                    postmaster,
                    lambda: one_event_posts(urls, posts),
                )
            )
            bodies = workload.heartbeats(sizes.batch_events, first_sequence=3_000_000)
            log(f"batches of {BATCH}: {sizes.batch_events:,} events over {REPLICAS} replicas")
            phases.append(
                await measured(
                    f"HTTP batches of {BATCH}",
                    "events",
                    procs,
                    postmaster,
                    lambda: batches(urls, bodies),
                )
            )
            paths = [p for label, (p, _) in read_paths(workload).items() if "page" not in label]
            log(f"reads: {sizes.reads:,} over {REPLICAS} replicas")
            phases.append(
                await measured(
                    f"API reads ({len(paths)} endpoints in turn)",
                    "reads",
                    procs,
                    postmaster,
                    lambda: reads(urls, paths, sizes.reads),
                )
            )
        stored = await stored_once(url)
    expected = sizes.events + sizes.posts + sizes.batch_events
    return Result(sizes, phases, stored, expected, fill, (time.monotonic() - began) / 60)


# -- the report -------------------------------------------------------------------------------


def render(result: Result, command: str, loads: tuple[float, float]) -> str:
    s = result.sizes
    lines = [
        "# Two fleet replicas on one PostgreSQL: the cost of each",
        "",
        f"`{command}`: {REPLICAS} `maintenance-bridge fleet` processes on one throwaway "
        f"PostgreSQL (`fsync=off`), pre-filled with {s.events:,} events of {s.instances:,} "
        f"VMs (`bench.fleet_workload`). Commit measured: {commit()}. Host: {os.cpu_count()} "
        f"CPUs, load average {loads[0]:.1f} at the start and {loads[1]:.1f} at the end (the "
        "load generator, both replicas and PostgreSQL share these cores: the rates below "
        "are not capacities; the CPU seconds are what each piece of work costs). The run "
        f"took {result.minutes:.1f} min.",
        "",
        "CPU seconds are user + system of each process over the phase; PostgreSQL's are the "
        "postmaster's and all its children's (backends, WAL writer, checkpointer, those that "
        "ended included).",
        "",
        "| phase | work (replica 1 + 2) | wall s | replica 1 CPU s / 1,000 | "
        "replica 2 CPU s / 1,000 | replicas' CPU s / 1,000 | PostgreSQL CPU s / 1,000 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in result.phases:
        per = [p.per_thousand(cpu, n) for cpu, n in zip(p.replica_cpu, p.done, strict=True)]
        both = p.per_thousand(sum(p.replica_cpu), p.total)
        pg = p.per_thousand(p.postgres_cpu, p.total)
        work = " + ".join(f"{n:,}" for n in p.done)
        lines.append(
            f"| {p.name} | {work} {p.unit} | {p.seconds:.1f} | {per[0]:.3f} | {per[1]:.3f} | "
            f"{both:.3f} | {pg:.3f} |"
        )
    rows, distinct = result.stored
    once = rows == distinct == result.expected
    lines += [
        "",
        f"- Every event stored once: the audit log holds {rows:,} rows, {distinct:,} distinct "
        f"(`source`, `id`), expected {result.expected:,} (pre-fill + posts + batches): "
        f"{'yes' if once else '**NO**'}.",
        f"- Pre-fill (not a figure): {s.events:,} events in {result.fill_seconds:.0f} s "
        "(`bench.fleet_prefill`).",
        "- Rates (wall): "
        + "; ".join(f"{p.name} {p.total / p.seconds:,.0f} {p.unit}/s" for p in result.phases)
        + ".",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_replicas", description=__doc__)
    parser.add_argument("--instances", type=int, default=20_000, help="VMs (default 20,000)")
    parser.add_argument("--events", type=int, default=100_000, help="pre-filled audit log")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it runs")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    sizes = sizes_of(args.instances, args.events, args.smoke)
    words = sys.argv[1:] if argv is None else argv
    command = " ".join(["python -m bench.fleet_replicas", *words])
    first_load = psutil.getloadavg()[0]
    workdir = Path(tempfile.mkdtemp(prefix="bench-fleet-replicas-"))
    try:
        result = asyncio.run(run(sizes, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report = render(result, command, (first_load, psutil.getloadavg()[0]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fleet-replicas.md").write_text(report)
    print(report)
    rows, distinct = result.stored
    return 0 if rows == distinct == result.expected else 1


if __name__ == "__main__":
    sys.exit(main())
