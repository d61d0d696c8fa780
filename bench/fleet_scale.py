"""`python -m bench.fleet_scale [--instances N] [--events N] [--smoke]`: the fleet at scale.

Issue 33's workload (`bench.fleet_workload`: 100,000 VMs over three clouds, 1,000,000 events
in the audit log, 5,000 notices in force) and every figure of its "Figures to reach" list,
for SQLite and PostgreSQL side by side in one run:

1. Pre-fill (not a figure): the audit log is written once and filled into both stores in
   this process by `bench.fleet_prefill` (ingest's own writer in large transactions, the
   audit log appended in bulk: `COPY` on PostgreSQL), what the figures about reads need;
   the ingest figures below go through the real paths.
2. The fleet service runs in its own process (`maintenance-bridge fleet --config`) on that
   store, with a signed `http` source and a read credential in `[fleet.auth]`; every read
   sends it as `Authorization: Bearer`, as Grafana or a script would.
3. One-event posts: the same signed heartbeats, in the order they fall due as a real
   fleet sends them (`Workload.due_heartbeats`) (one CloudEvent per request, structured
   mode, Standard Webhooks signature) from 64 concurrent senders in this process, to a
   do-nothing aiohttp server (`bench.fleet_floor`, its own process) and to the fleet
   service (each answered after its commit), taking turns over 5 rounds; requests per
   second, and the median of the rounds' ratios.
4. HTTP batches of 100 (the webhook sink's batch mode) of heartbeats in the order they fall
   due, 4 senders: events per second, and the CPU an event cost in the fleet, in the
   senders and in PostgreSQL's server, with the rate those costs allow on this host.
5. Reads, one at a time over a keep-alive connection: every endpoint of the API (the
   unfiltered lists included), eligible, and the page's server render: p50 and p99.
6. The page in Chromium (Playwright, as the tests drive it): navigation start to the first
   table, p99.
7. The service's RSS (now and its peak so far).
8. A burst: a region's maintenance starts, 50,000 events posted one per request by 512
   concurrent senders, each retrying after Retry-After when answered 503, while a reader
   keeps asking the API: the burst's rate, how many 503s came and whether each carried a
   Retry-After, the API p99 during it, and the service's peak RSS during it.
9. The bus sources (Pub/Sub emulator, the test AMQP Event Hubs server, librdkafka's mock
   cluster): a backlog of `--bus-events` events drained by the fleet service running in this
   process into a fresh store of each kind (the servers' own cost shares these 2 cores: the
   emulator, the Event Hubs server and Kafka's mock brokers in processes of their own), with
   the CPU seconds this process spent per 1,000 events.

Writes `fleet-scale.md` and `fleet-scale.png` in `--out` (default bench/results).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp
import psutil

from bench.dashboard import browser_loads
from bench.drain import environment
from bench.fleet import SECRET, ingest, latency
from bench.fleet_ingest import Figure, KafkaProcess, cpu_seconds, eventhubs, kafka, pubsub
from bench.fleet_ingest import stores as throwaway_stores
from bench.fleet_prefill import CHUNK as FILL_CHUNK
from bench.fleet_prefill import prefill as fast_prefill
from bench.fleet_workload import Workload
from bench.fleet_writes import server_cpu
from bench.procs import ROOT, Proc, child_env, commit, peak_rss_mb, spawn
from bench.stats import Summary, summarize
from bridge import contract
from bridge.transports import webhook_signing as signing
from tests.support import free_port

#: The read credential of this run (`[[fleet.auth.credentials]]`), new each run.
READ_TOKEN: Final = secrets.token_hex(16)
SENDERS: Final = 64
#: Rounds of the one-event posts figure: the floor and the fleet take turns.
POSTS_ROUNDS: Final = 5
BURST_SENDERS: Final = 512
STRUCTURED: Final = "application/cloudevents+json"

#: The issue's targets.
POSTS_RATIO: Final = 0.5
BATCH_TARGET: Final = 20_000.0
BUS_TARGET: Final = 10_000.0
READ_P99: Final = 50.0
ELIGIBLE_P99: Final = 10.0
RENDER_P99: Final = 300.0
FIRST_TABLE_P99: Final = 500.0
RSS_TARGET: Final = 200.0
BURST_API_P99: Final = 100.0


@dataclass(frozen=True)
class Scale:
    instances: int
    events: int
    burst: int
    posts: int  # one-event posts per target
    batch_events: int
    bus_events: int
    requests: int  # per read endpoint, at most
    budget: float  # seconds per read endpoint, at most
    loads: int  # page loads in Chromium


def scale(
    instances: int, events: int, smoke: bool, burst: int | None = None, budget: float | None = None
) -> Scale:
    sizes = (
        Scale(instances, events, 600, 300, 500, 200, 5, 2.0, 1)
        if smoke
        else Scale(instances, events, 50_000, 20_000, 50_000, 20_000, 200, 20.0, 10)
    )
    return replace(
        sizes,
        burst=sizes.burst if burst is None else burst,
        budget=sizes.budget if budget is None else budget,
    )


@dataclass
class Reads:
    label: str
    summary: Summary
    size: int
    target: float


@dataclass
class Burst:
    events: int
    seconds: float
    statuses: dict[int, int]
    busy_without_retry_after: int
    api: Summary
    peak_rss_mb: float
    rss_before_mb: float


@dataclass
class StoreFigures:
    store: str
    fill_seconds: float = 0.0
    floor_rps: float = 0.0
    posts_rps: float = 0.0
    posts_statuses: dict[int, int] = field(default_factory=dict)
    #: (floor, fleet) requests per second of each round, and the median of their ratios.
    posts_rounds: list[tuple[float, float]] = field(default_factory=list)
    posts_ratio: float = 0.0
    batch_rate: float = 0.0
    #: CPU microseconds per event of the HTTP batches: the fleet process's, the senders'
    #: (this process) and the database server's (PostgreSQL; None for SQLite, in the fleet).
    batch_cpu: tuple[float, float, float | None] | None = None
    reads: list[Reads] = field(default_factory=list)
    first_table: Summary | None = None
    rss_mb: float = 0.0
    peak_rss_mb: float = 0.0
    burst: Burst | None = None
    bus: list[Figure] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    measured: bool = False


def log(text: str) -> None:
    print(f"[bench.fleet_scale {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def noted(notes: list[str], what: str) -> Iterator[None]:
    """A part that fails is noted in the report and the run goes on: a long run at full
    size keeps every other figure. (The smoke test fails on any such note.)"""
    try:
        yield
    except Exception as exc:
        log(f"{what} failed: {exc!r}")
        notes.append(f"{what}: FAILED, {type(exc).__name__}: {exc}")


# -- pre-fill ---------------------------------------------------------------------------------


async def prefill(urls: list[str], workload: Workload) -> list[float]:
    """The audit log into every store at once (written once; `bench.fleet_prefill`: ingest's
    own writer, the audit log appended in bulk); seconds spent in each store."""

    def progress(done: int) -> None:
        if done % 100_000 < FILL_CHUNK:
            log(f"pre-filled {done:,} of {workload.events:,} events")

    return await fast_prefill(urls, workload.history(), progress=progress)


# -- the processes ----------------------------------------------------------------------------


def fleet_config(port: int, store_url: str) -> str:
    return (
        f"[fleet.listener]\nport = {port}\n"
        f'[fleet.store]\nurl = "{store_url}"\n'
        "[[fleet.auth.credentials]]\n"
        'name = "bench-reader"\nscopes = ["read", "eligible"]\n'
        f'token = "{READ_TOKEN}"\n'
        f'[[fleet.sources]]\ntype = "http"\nsecrets = ["{SECRET}"]\n'
    )


async def ready(url: str, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(url + "/readyz") as answer:
                    if answer.status == 200:
                        return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not become ready")
            await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def fleet_process(
    workdir: Path, store_url: str, name: str
) -> AsyncIterator[tuple[str, Proc]]:
    port = free_port()
    directory = workdir / name
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "fleet.toml"
    config.write_text(fleet_config(port, store_url))
    proc = await spawn("fleet", ["-m", "bridge", "fleet", "--config", str(config)], directory)
    try:
        url = f"http://127.0.0.1:{port}"
        await ready(url, "the fleet service")
        yield url, proc
    finally:
        await proc.stop()


@contextlib.asynccontextmanager
async def floor_process(workdir: Path) -> AsyncIterator[str]:
    port = free_port()
    proc = await spawn("floor", ["-m", "bench.fleet_floor", str(port)], workdir)
    try:
        url = f"http://127.0.0.1:{port}"
        await ready(url, "the do-nothing server")
        yield url
    finally:
        await proc.stop()


# -- one-event posts and the burst ------------------------------------------------------------


def signed(body: bytes, key: bytes) -> dict[str, str]:
    """The headers of one structured-mode post, signed as the webhook sink signs it."""
    event_id = contract.from_cloudevent(body).id
    headers = signing.standard_headers(event_id, int(time.time()), body, [key])
    headers["content-type"] = STRUCTURED
    return headers


@dataclass
class Posted:
    seconds: float
    statuses: dict[int, int]
    busy_without_retry_after: int


async def post_each(
    url: str,
    bodies: list[bytes],
    senders: int,
    retry_busy: bool,
    headers: list[dict[str, str]] | None = None,
) -> Posted:
    """Each body as its own signed POST from `senders` concurrent senders; with
    `retry_busy`, a 503 is retried after its Retry-After (capped at 2 s), as the sink does.
    Each attempt is signed as it is sent, as the webhook sink does: a signature made
    minutes before is refused as stale (a long burst outlasts the signature's tolerance).
    `headers`, one per body, signed just before: the first attempts send those instead."""
    key = signing.standard_key(SECRET)
    statuses: dict[int, int] = {}
    missing = 0
    made: list[dict[str, str] | None] = [*headers] if headers else [None] * len(bodies)
    queue = iter(zip(bodies, made, strict=True))
    connector = aiohttp.TCPConnector(limit=senders)
    timeout = aiohttp.ClientTimeout(total=120)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def sender() -> None:
            nonlocal missing
            for body, ready in queue:
                while True:
                    sent, ready = ready or signed(body, key), None
                    async with http.post(url + "/v1/events", data=body, headers=sent) as answer:
                        await answer.read()
                        statuses[answer.status] = statuses.get(answer.status, 0) + 1
                        retry_after = answer.headers.get("Retry-After")
                    if answer.status != 503 or not retry_busy:
                        break
                    if retry_after is None:
                        missing += 1
                    await asyncio.sleep(min(2.0, float(retry_after or 1)))

        began = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(senders)))
        return Posted(time.perf_counter() - began, statuses, missing)


async def one_event_posts(
    figures: StoreFigures, fleet_url: str, floor_url: str, workload: Workload, posts: int
) -> None:
    """The do-nothing server and the fleet take turns, `POSTS_ROUNDS` rounds of an equal
    share of the posts each (which one goes first alternates), from the same client: the
    host's load drifts (the floor alone once varied twofold within one run), and rounds
    side by side in time see the same drift. Each round's posts are signed just before it,
    off the clock, for both alike. The figure is the median of the rounds' ratios (fleet
    over the floor of the same round); the rates shown are each side's median round."""
    bodies = workload.due_heartbeats(posts, first_sequence=2_000_000)
    key = signing.standard_key(SECRET)
    share = -(-len(bodies) // POSTS_ROUNDS)
    rounds: list[tuple[float, float]] = []
    for number in range(POSTS_ROUNDS):
        chunk = bodies[number * share : (number + 1) * share]
        if not chunk:
            break
        rates = {}
        for url in (floor_url, fleet_url) if number % 2 == 0 else (fleet_url, floor_url):
            signatures = [signed(body, key) for body in chunk]
            posted = await post_each(url, chunk, SENDERS, retry_busy=False, headers=signatures)
            rates[url] = len(chunk) / posted.seconds
            if url == fleet_url:
                for status, count in posted.statuses.items():
                    figures.posts_statuses[status] = figures.posts_statuses.get(status, 0) + count
        rounds.append((rates[floor_url], rates[fleet_url]))
    figures.posts_rounds = rounds
    figures.floor_rps = statistics.median(floor for floor, _ in rounds)
    figures.posts_rps = statistics.median(fleet for _, fleet in rounds)
    figures.posts_ratio = statistics.median(fleet / floor for floor, fleet in rounds)


@contextlib.asynccontextmanager
async def reader(url: str, paths: list[str]) -> AsyncIterator[list[float]]:
    """`bench.fleet_reader` in its own process, asking `paths` in turn while the block runs;
    its latencies (ms) fill the list yielded when the block ends."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.fleet_reader",
        url,
        *paths,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=child_env({"FLEET_BENCH_TOKEN": READ_TOKEN}),
        cwd=ROOT,
    )
    samples: list[float] = []
    try:
        yield samples
    finally:
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.close()
        output = await process.stdout.read()
        await process.wait()
        samples.extend(json.loads(output or b"[]"))


async def burst(url: str, proc: Proc, workload: Workload, count: int, paths: list[str]) -> Burst:
    bodies = workload.burst(count)
    rss_before = float(proc.ps().memory_info().rss) / 2**20
    peak = rss_before
    stop = asyncio.Event()

    async def sample_rss() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, float(proc.ps().memory_info().rss) / 2**20)
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample_rss())
    async with reader(url, paths) as api:
        await asyncio.sleep(0.5)  # the reader is under way before the burst
        try:
            posted = await post_each(url, bodies, BURST_SENDERS, retry_busy=True)
        finally:
            stop.set()
    await sampler
    return Burst(
        len(bodies),
        posted.seconds,
        posted.statuses,
        posted.busy_without_retry_after,
        summarize(api),
        peak,
        rss_before,
    )


# -- reads ------------------------------------------------------------------------------------


def read_paths(workload: Workload) -> dict[str, tuple[str, float]]:
    """label -> (path, p99 target ms) of every read of the API and of the page."""
    busy, quiet, other = workload.in_force_vm(0), workload.quiet_vm(), workload.in_force_vm(1)
    zone = busy.zone
    return {
        "notices, all in force": ("/v1/fleet/notices", READ_P99),
        "notices, one instance": (f"/v1/fleet/notices?instance={busy.name}", READ_P99),
        "notices, one zone": (f"/v1/fleet/notices?zone={zone}", READ_P99),
        "upcoming, 24 h": ("/v1/fleet/upcoming", READ_P99),
        "instances, all": ("/v1/fleet/instances", READ_P99),
        "instances, one zone": (f"/v1/fleet/instances?zone={zone}", READ_P99),
        "instances, search by a part of the name": ("/v1/fleet/instances?q=gce-0012", READ_P99),
        "instances, one": (f"/v1/fleet/instances/{busy.name}", READ_P99),
        "summary": ("/v1/fleet/summary", READ_P99),
        "events, first page": ("/v1/fleet/events", READ_P99),
        "events, one instance": (f"/v1/fleet/events?instance={busy.name}", READ_P99),
        "rejected": ("/v1/fleet/rejected", READ_P99),
        "eligible, 3 candidates": (
            f"/v1/fleet/eligible?instance={busy.name}&instance={quiet.name}&instance={other.name}",
            ELIGIBLE_P99,
        ),
        "page / (server render)": ("/", RENDER_P99),
        "page /?zone= (server render)": (f"/?zone={zone}", RENDER_P99),
        "page /?q= (a search, server render)": (f"/?q={busy.name[:-2]}", RENDER_P99),
        "page /?state=silent (instances listed)": ("/?state=silent", RENDER_P99),
        "page /instances/<name> (server render)": (f"/instances/{busy.name}", RENDER_P99),
    }


async def reads(url: str, workload: Workload, sizes: Scale) -> list[Reads]:
    headers = {"Authorization": f"Bearer {READ_TOKEN}"}
    found = []
    for label, (path, target) in read_paths(workload).items():
        log(f"timing {label}")
        summary, size = await latency(
            url, path, sizes.requests, headers=headers, budget=sizes.budget
        )
        found.append(Reads(label, summary, size, target))
    return found


def database_server(url: str) -> int | None:
    """The pid of the PostgreSQL server listening on `url`'s port (None for SQLite, which
    runs in the fleet process, or when it cannot be found): its CPU is part of what an
    event costs."""
    if not url.startswith("postgresql://"):
        return None
    port = urlsplit(url).port
    with contextlib.suppress(psutil.Error):
        for connection in psutil.net_connections(kind="tcp"):
            address = connection.laddr
            if connection.status == psutil.CONN_LISTEN and address and address.port == port:
                return connection.pid
    return None


def batch_budget(f: StoreFigures) -> str:
    """The CPU an event of the HTTP batches cost, per process, and the rate those costs allow
    on this host's cores (all of them busy, nothing else running): the ceiling the batch
    figure sits under, and which part would have to shrink to lift it."""
    if f.batch_cpu is None:
        return ""
    fleet_us, sender_us, server_us = f.batch_cpu
    total = fleet_us + sender_us + (server_us or 0.0)
    parts = [f"fleet {fleet_us:.0f}", f"senders {sender_us:.0f}"]
    if server_us is not None:
        parts.append(f"PostgreSQL {server_us:.0f}")
    cores = os.cpu_count() or 1
    return (
        f"; CPU per event {', '.join(parts)} us: at most {cores * 1e6 / total:,.0f} events/s "
        f"on {cores} cores at these costs"
    )


# -- the bus sources --------------------------------------------------------------------------


def _cpu_per_thousand(figure: Figure) -> str:
    """The fleet process's CPU seconds per 1,000 events of a bus row (a figure that the
    other programs on the host move less than the rate)."""
    if figure.cpu_s is None or not figure.events:
        return ""
    return f" ({figure.cpu_s * 1000 / figure.events:.2f} CPU s per 1,000)"


async def bus_figures(
    store: str, new_url: Any, workload: Workload, count: int, servers: dict[str, Any]
) -> tuple[list[Figure], list[str]]:
    figures: list[Figure] = []
    notes: list[str] = []
    bodies = workload.burst(count, tag="bus")
    emulator = servers.get("pubsub")
    if emulator is not None:
        log(f"{store}: Pub/Sub")
        with noted(notes, "Pub/Sub"), environment("PUBSUB_EMULATOR_HOST", emulator.host):
            figures.append(await pubsub(new_url(), store, bodies, emulator))
    log(f"{store}: Event Hubs")
    with noted(notes, "Event Hubs"):
        figures.append(await eventhubs(new_url(), store, bodies))
    cluster = servers.get("kafka")
    if cluster is not None:
        log(f"{store}: Kafka")
        with noted(notes, "Kafka"):
            figures.append(await kafka(new_url(), store, bodies, cluster))
    return figures, notes


@contextlib.asynccontextmanager
async def bus_servers(notes: list[str]) -> AsyncIterator[dict[str, Any]]:
    from tests.sinks.kafka_mock import library
    from tests.sinks.pubsub_emulator import Emulator, find_script

    servers: dict[str, Any] = {}
    script = find_script()
    if script is None:
        notes.append("Pub/Sub: not measured, the emulator (Google Cloud CLI + Java) is missing")
    else:
        servers["pubsub"] = Emulator(script)
        await asyncio.to_thread(servers["pubsub"].start)
    lib = library()
    if lib is None:
        notes.append("Kafka: not measured, confluent-kafka (the kafka extra) is missing")
    else:
        servers["kafka"] = KafkaProcess()
        await asyncio.to_thread(servers["kafka"].start)
    try:
        yield servers
    finally:
        if "pubsub" in servers:
            await asyncio.to_thread(servers["pubsub"].stop)
        if "kafka" in servers:
            servers["kafka"].stop()


# -- one store, and the run -------------------------------------------------------------------


async def measure(
    figures: StoreFigures, url: str, workload: Workload, sizes: Scale, workdir: Path
) -> None:
    name = figures.store
    async with fleet_process(workdir, url, name.lower()) as (fleet_url, proc):
        notes = figures.notes
        with noted(notes, "one-event posts"):
            async with floor_process(workdir) as floor_url:
                log(f"{name}: one-event posts, {SENDERS} senders")
                await one_event_posts(figures, fleet_url, floor_url, workload, sizes.posts)
        log(f"{name}: HTTP batches of 100")
        with noted(notes, "HTTP batches"):
            bodies = workload.due_heartbeats(sizes.batch_events, first_sequence=3_000_000)
            server = database_server(url)
            before = proc.cpu_seconds(), cpu_seconds(), server_cpu(server) if server else 0.0
            figures.batch_rate = await ingest(fleet_url, bodies)
            after = proc.cpu_seconds(), cpu_seconds(), server_cpu(server) if server else 0.0
            fleet_us, sender_us, server_us = (
                (end - start) / len(bodies) * 1e6 for start, end in zip(before, after, strict=True)
            )
            figures.batch_cpu = (fleet_us, sender_us, server_us if server else None)
        with noted(notes, "reads"):
            figures.reads = await reads(fleet_url, workload, sizes)
        log(f"{name}: the page in Chromium")
        headers = {"Authorization": f"Bearer {READ_TOKEN}"}
        with noted(notes, "the page in Chromium"):
            browser = await browser_loads(fleet_url + "/", workdir / name, sizes.loads, headers)
            if browser is None:
                notes.append("the page in Chromium: not measured, Chromium is missing")
            else:
                figures.first_table = browser[0]
        figures.rss_mb = float(proc.ps().memory_info().rss) / 2**20
        figures.peak_rss_mb = peak_rss_mb(proc.pid)
        log(f"{name}: a burst of {sizes.burst:,} events, {BURST_SENDERS} senders")
        busy, quiet = workload.in_force_vm(0), workload.quiet_vm()
        # What a VM's election and a per-VM panel ask; the lists and the summary have their
        # own figures above (asking them here would time them again, not the burst).
        api = [
            f"/v1/fleet/notices?instance={busy.name}",
            f"/v1/fleet/eligible?instance={busy.name}&instance={quiet.name}",
            f"/v1/fleet/instances/{busy.name}",
        ]
        with noted(notes, "the burst"):
            figures.burst = await burst(fleet_url, proc, workload, sizes.burst, api)
        with noted(notes, "the store's row counts"):
            async with (
                aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(300)) as http,
                http.get(fleet_url + "/v1/fleet/summary") as answer,
            ):
                summary = await answer.json()
                if answer.status != 200:
                    raise RuntimeError(f"/v1/fleet/summary answered {answer.status}: {summary}")
                figures.counts = summary["store"]
    figures.measured = True


async def run(
    sizes: Scale, workdir: Path, progress: Callable[[list[StoreFigures], list[str], float], None]
) -> tuple[list[StoreFigures], list[str], float]:
    """Every figure for each store; `progress` gets what is measured after each store and
    at the end (the report is written each time, so a run cut short keeps its figures)."""
    workload = Workload(sizes.instances, sizes.events)
    notes: list[str] = []
    began = time.monotonic()
    async with throwaway_stores(workdir) as available:
        if len(available) == 1:
            notes.append("PostgreSQL: not measured, initdb/pg_ctl are missing")
        urls = {name: new_url() for name, new_url in available}
        results = {name: StoreFigures(name) for name in urls}
        log(f"writing and pre-filling {sizes.events:,} events of {sizes.instances:,} VMs")
        spent = await prefill(list(urls.values()), workload)
        for (name, _url), seconds in zip(urls.items(), spent, strict=True):
            results[name].fill_seconds = seconds
        for name, url in urls.items():
            await measure(results[name], url, workload, sizes, workdir)
            progress(list(results.values()), notes, time.monotonic() - began)
        async with bus_servers(notes) as servers:
            for name, new_url in available:
                bus, more = await bus_figures(name, new_url, workload, sizes.bus_events, servers)
                results[name].bus = bus
                results[name].notes.extend(more)
    return list(results.values()), notes, time.monotonic() - began


# -- the report -------------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "pass" if ok else "**miss**"


def store_table(f: StoreFigures, sizes: Scale) -> list[str]:
    rows: list[tuple[str, str, str, bool | None]] = []
    ratio = f.posts_ratio
    rows.append(
        (
            f"one-event signed posts, {SENDERS} senders, vs a do-nothing aiohttp server "
            f"(median of {len(f.posts_rounds)} rounds, taking turns)",
            f">= {POSTS_RATIO:g} of it",
            f"{f.posts_rps:,.0f} req/s vs {f.floor_rps:,.0f} req/s: {ratio:.2f}",
            ratio >= POSTS_RATIO,
        )
    )
    rows.append(
        (
            "HTTP batches of 100, 4 senders",
            f">= {BATCH_TARGET:,.0f} events/s",
            f"{f.batch_rate:,.0f} events/s{batch_budget(f)}",
            f.batch_rate >= BATCH_TARGET,
        )
    )
    for bus in f.bus:
        rows.append(
            (
                bus.path,
                f">= {BUS_TARGET:,.0f} events/s",
                f"{bus.rate:,.0f} events/s{_cpu_per_thousand(bus)}",
                bus.rate >= BUS_TARGET,
            )
        )
    for read in f.reads:
        rows.append(
            (
                f"{read.label} (p50 {read.summary.p50:.1f} ms, {read.size:,} bytes, "
                f"n={read.summary.count})",
                f"p99 < {read.target:g} ms",
                f"p99 {read.summary.p99:.1f} ms",
                read.summary.p99 < read.target,
            )
        )
    if f.first_table is not None:
        rows.append(
            (
                f"page / in Chromium, first table (p50 {f.first_table.p50:.0f} ms, "
                f"n={f.first_table.count})",
                f"p99 < {FIRST_TABLE_P99:g} ms",
                f"p99 {f.first_table.p99:.0f} ms",
                f.first_table.p99 < FIRST_TABLE_P99,
            )
        )
    rows.append(
        (
            "fleet service RSS after the reads (peak so far)",
            f"<= {RSS_TARGET:g} MiB",
            f"{f.rss_mb:.0f} MiB ({f.peak_rss_mb:.0f})",
            f.peak_rss_mb <= RSS_TARGET,
        )
    )
    if f.burst is not None:
        b = f.burst
        busy = b.statuses.get(503, 0)
        statuses = ", ".join(f"{code}: {n:,}" for code, n in sorted(b.statuses.items()))
        rows.append(
            (
                f"burst of {b.events:,} one-event posts, {BURST_SENDERS} senders: "
                f"{b.events / b.seconds:,.0f} events/s; answers {statuses}",
                "bounded memory: peak RSS",
                f"{b.peak_rss_mb:.0f} MiB (from {b.rss_before_mb:.0f})",
                b.peak_rss_mb <= RSS_TARGET,
            )
        )
        rows.append(
            (
                "burst: back-pressure, 503 with Retry-After",
                "503s carry Retry-After",
                f"{busy:,} answered 503, {b.busy_without_retry_after} without Retry-After",
                None if busy == 0 else b.busy_without_retry_after == 0,
            )
        )
        rows.append(
            (
                f"burst: API during it, one VM's notices, eligible and instance in turn "
                f"(p50 {b.api.p50:.1f} ms, n={b.api.count})",
                f"p99 < {BURST_API_P99:g} ms",
                f"p99 {b.api.p99:.1f} ms",
                b.api.p99 < BURST_API_P99,
            )
        )
    lines = [
        f"## {f.store}",
        "",
        "| figure | target | measured | verdict |",
        "| --- | --- | --- | --- |",
    ]
    for figure, target, measured, ok in rows:
        verdict = "no 503 came" if ok is None else _verdict(ok)
        lines.append(f"| {figure} | {target} | {measured} | {verdict} |")
    lines += [
        "",
        f"- pre-fill (not a figure): {sizes.events:,} events through ingest's own writer in "
        f"transactions of {FILL_CHUNK:,}, the audit log appended in bulk (`bench.fleet_prefill`),"
        f" in the benchmark's process, {f.fill_seconds:,.0f} s in the "
        f"store ({sizes.events / f.fill_seconds if f.fill_seconds else 0:,.0f} events/s)",
        f"- one-event posts to the fleet were answered {f.posts_statuses}; each round, the "
        "floor's and the fleet's requests/s: "
        + ", ".join(f"{floor:,.0f} and {fleet:,.0f}" for floor, fleet in f.posts_rounds),
        f"- rows at the end: {', '.join(f'{k} {v:,}' for k, v in sorted(f.counts.items()))}",
        *(f"- {note}" for note in f.notes),
        "",
    ]
    return lines


def render(
    results: list[StoreFigures],
    notes: list[str],
    sizes: Scale,
    loads: tuple[float, float],
    seconds: float,
    command: str,
    plot_name: str | None,
) -> str:
    lines = [
        "# The fleet at scale: SQLite and PostgreSQL side by side",
        "",
        f"`{command}`: {sizes.instances:,} instances over three clouds, {sizes.events:,} "
        f"events in the audit log, {min(5000, max(1, sizes.instances // 20)):,} notices in "
        f"force, a burst of {sizes.burst:,} events (issue 33's workload, `bench.fleet_workload`). "
        f"Commit measured: {commit()}. Host: {os.cpu_count()} CPUs, load average "
        f"{loads[0]:.1f} at the start and {loads[1]:.1f} at the end (the machine is shared: "
        f"p99s are only comparable between quiet runs). The run took {seconds / 60:.1f} min.",
        "",
        "The fleet service runs in its own process (`maintenance-bridge fleet`) with a signed "
        "`http` source and a read credential in `[fleet.auth]`; PostgreSQL is a throwaway "
        "local server (`fsync=off`, so the fleet service is measured, not this VM's disk). "
        "Reads are one at a time over a keep-alive connection with the read credential. The "
        "bus figures drain a backlog of "
        f"{sizes.bus_events:,} events into a fresh store of each kind, with the fleet service "
        "and the test servers in the benchmark's process.",
        "",
    ]
    if plot_name:
        lines += [f"![read p99 and ingest rates per store]({plot_name})", ""]
    for figures in results:
        if figures.measured:
            lines += store_table(figures, sizes)
        else:
            lines += [f"## {figures.store}", "", "Not measured yet (the run was cut short).", ""]
    if notes:
        lines += ["## Not measured", "", *(f"- {note}" for note in notes), ""]
    return "\n".join(lines)


def plot(results: list[StoreFigures], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (reads_ax, rates_ax) = plt.subplots(1, 2, figsize=(13, 6.5), width_ratios=(3, 2))
    labels = list(dict.fromkeys(r.label for store in results for r in store.reads))
    height = 0.8 / len(results)
    for n, store in enumerate(results):
        p99 = {r.label: r.summary.p99 for r in store.reads}
        positions = [i + n * height for i in range(len(labels))]
        values = [p99.get(label, 0.0) for label in labels]
        reads_ax.barh(positions, values, height, label=store.store)
    reads_ax.set_yticks([i + 0.4 - height / 2 for i in range(len(labels))], labels, fontsize=8)
    reads_ax.invert_yaxis()
    reads_ax.set_xscale("log")
    for target, style in ((READ_P99, "--"), (ELIGIBLE_P99, ":"), (RENDER_P99, "-.")):
        reads_ax.axvline(target, color="black", linestyle=style, linewidth=0.8)
    reads_ax.set_xlabel("p99 ms (log); lines: 10 ms eligible, 50 ms API, 300 ms page")
    reads_ax.set_title("Reads")
    reads_ax.legend()
    kinds = ["one-event posts (req/s)", "do-nothing server (req/s)", "HTTP batches of 100"]
    kinds += sorted({b.path for store in results for b in store.bus})
    for n, store in enumerate(results):
        bus = {b.path: b.rate for b in store.bus}
        values = [store.posts_rps, store.floor_rps, store.batch_rate] + [
            bus.get(kind, 0.0) for kind in kinds[3:]
        ]
        positions = [i + n * height for i in range(len(kinds))]
        rates_ax.barh(positions, values, height, label=store.store)
    rates_ax.set_yticks([i + 0.4 - height / 2 for i in range(len(kinds))], kinds, fontsize=8)
    rates_ax.invert_yaxis()
    rates_ax.axvline(BATCH_TARGET, color="black", linestyle="--", linewidth=0.8)
    rates_ax.axvline(BUS_TARGET, color="black", linestyle=":", linewidth=0.8)
    rates_ax.set_xlabel("per second; lines: 20,000 batches, 10,000 bus")
    rates_ax.set_title("Ingest")
    rates_ax.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_scale", description=__doc__)
    parser.add_argument("--instances", type=int, default=100_000, help="VMs (default 100,000)")
    parser.add_argument("--events", type=int, default=1_000_000, help="audit log size")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it runs")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--name", default="fleet-scale", help="report file name, no suffix")
    parser.add_argument("--burst", type=int, help="events of the burst (default 50,000)")
    parser.add_argument(
        "--read-seconds", type=float, help="seconds per read endpoint, at most (default 20)"
    )
    args = parser.parse_args(argv)
    sizes = scale(args.instances, args.events, args.smoke, args.burst, args.read_seconds)
    words = sys.argv[1:] if argv is None else argv
    command = " ".join(["python -m bench.fleet_scale", *words])
    first_load = psutil.getloadavg()[0]
    args.out.mkdir(parents=True, exist_ok=True)
    png = args.out / f"{args.name}.png"

    def write(results: list[StoreFigures], notes: list[str], seconds: float) -> None:
        plot(results, png)
        loads = (first_load, psutil.getloadavg()[0])
        report = render(results, notes, sizes, loads, seconds, command, png.name)
        (args.out / f"{args.name}.md").write_text(report)

    workdir = Path(tempfile.mkdtemp(prefix="bench-fleet-scale-"))
    try:
        results, notes, seconds = asyncio.run(run(sizes, workdir, write))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    write(results, notes, seconds)
    print((args.out / f"{args.name}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
