"""`python -m bench.fleet [--quick] [--out DIR]`: the fleet service's ingest rate and API latency.

What it measures, with the fleet service in its own process (`maintenance-bridge fleet`,
SQLite store, one signed `http` source) as in production:

- HTTP batch ingest into SQLite: the events of `instances` VMs (heartbeats and maintenance
  transitions written by the sidecar's own writers, `events` in all) posted as the webhook
  sink posts them (batches of 100, Standard Webhooks signatures) by a few concurrent
  senders; events per second from the first request to the last 200.
- With that fleet stored: the latency of `GET /v1/fleet/notices` (all notices in force, and
  filtered by instance and by zone) and `GET /v1/fleet/eligible` (three candidates), one
  request at a time over a keep-alive connection, p50 and p99.
- Memory: the service's peak RSS.
- Identity (#34): the same signed batches, grouped by VM, into a fleet with
  `identity = "required"` (enrolled sidecars, each post with its instance credential) and
  one with `identity = "off"`, side by side (`bench.fleet_identity`); the target is a rate
  with identity at least 90 % of the rate without.

Writes `fleet.md` in `--out` (default bench/results). Targets (issue 19): ingest >= 5,000
events/s on 2 cores; both endpoints p99 < 50 ms at 10,000 instances / 100,000 events. The
unfiltered notices answer carries every notice in force with its history, so its size grows
with the fleet's maintenance; the filtered forms are what a per-VM dashboard panel or an
election asks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import httpx
import psutil

from bench import fleet_identity
from bench.fleet_workload import heartbeat
from bench.procs import ROOT, Proc, commit, spawn
from bench.stats import Summary, summarize
from bridge.pipeline.events import serialize, to_cloudevent
from bridge.pipeline.model import Instance, Kind, Notice, Provider, Status
from bridge.transports import webhook_signing as signing
from sinks.webhook import BATCH_SIZE
from tests.fleet.factories import azure_vm, gce_vm
from tests.support import free_port

SECRET = "whsec_" + "YmVuY2gtZmxlZXQtc2VjcmV0LWtleS0wMDAwMDAwMDE="
ZONES = ("us-central1-a", "us-central1-b", "europe-west1-b", "asia-east1-a")
SENDERS = 4
INGEST_TARGET = 5000.0
LATENCY_TARGET_MS = 50.0


@dataclass(frozen=True)
class Sizes:
    instances: int
    events: int
    requests: int


FULL = Sizes(10_000, 100_000, 200)
QUICK = Sizes(200, 2_000, 20)


def _vm(index: int) -> Instance:
    """VM `index` of the fleet: odd ones on GCE over four zones, even ones on Azure in 50
    scale sets."""
    if index % 2:
        return gce_vm(f"vm-{index:05d}", ZONES[index % len(ZONES)])
    return azure_vm(f"az-{index:05d}", "bench", f"set-{index % 50}", zone=str(index % 3 + 1))


def fleet_events(sizes: Sizes, now: datetime) -> list[bytes]:
    """`sizes.events` events of `sizes.instances` VMs: per VM a heartbeat, two finished
    notices (scheduled, started, completed) and, for one VM in 20, one scheduled notice in
    force; padded with more heartbeats. Shuffled a little, as a bus delivers them."""
    bodies: list[bytes] = []
    rng = random.Random(19)
    per_vm = max(1, sizes.events // sizes.instances)
    for index in range(sizes.instances):
        vm = _vm(index)
        start = now - timedelta(hours=6)
        bodies.append(heartbeat(vm, 0, now - timedelta(seconds=30), up_for=timedelta(days=1)))
        for n in range(2 if per_vm >= 7 else 0):
            for step, status in enumerate((Status.SCHEDULED, Status.STARTED, Status.COMPLETED)):
                at = start + timedelta(minutes=30 * n + step)
                bodies.append(_transition(vm, f"n{n}", status, at, at + timedelta(minutes=1)))
        if index % 20 == 0:
            not_before = now + timedelta(minutes=rng.randrange(5, 48 * 60))
            bodies.append(_transition(vm, "n2", Status.SCHEDULED, now, not_before))
    sequence = 1
    while len(bodies) < sizes.events:
        vm = _vm(rng.randrange(sizes.instances))
        at = now - timedelta(seconds=rng.randrange(1, 60))
        bodies.append(heartbeat(vm, sequence, at, up_for=timedelta(days=1)))
        sequence += 1
    for index in range(0, len(bodies) - 1, 7):  # some out of order
        bodies[index], bodies[index + 1] = bodies[index + 1], bodies[index]
    return bodies[: sizes.events]


def _transition(
    vm: Instance, notice_id: str, status: Status, at: datetime, not_before: datetime
) -> bytes:
    kind = Kind.LIVE_MIGRATE if vm.provider is Provider.GCE else Kind.FREEZE
    notice = Notice(vm, kind, status, f"{vm.name}-{notice_id}", at, not_before=not_before)
    return serialize(to_cloudevent(notice))


async def start_fleet(workdir: Path, port: int, extra: str = "", identity: str = "off") -> Proc:
    """`maintenance-bridge fleet` on `port`, its store in `workdir`; `extra` TOML tables
    (`[fleet.identity]`) and the source's `identity` mode for the identity arm."""
    config = workdir / "fleet.toml"
    config.write_text(
        f'[fleet.listener]\nport = {port}\n[fleet.store]\nurl = "sqlite://{workdir}/fleet.db"\n'
        f'{extra}[[fleet.sources]]\ntype = "http"\nsecrets = ["{SECRET}"]\n'
        f'identity = "{identity}"\n'
    )
    proc = await spawn("fleet", ["-m", "bridge", "fleet", "--config", str(config)], workdir)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        deadline = time.monotonic() + 60
        while True:
            try:
                if (await http.get("/readyz")).status_code == 200:
                    return proc
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the fleet service did not become ready")
            await asyncio.sleep(0.1)


async def ingest(url: str, bodies: list[bytes]) -> float:
    """Post `bodies` in webhook-sink batches from SENDERS senders; events per second."""
    batches = [bodies[i : i + BATCH_SIZE] for i in range(0, len(bodies), BATCH_SIZE)]
    return await post_batches(url, [(batch, {}) for batch in batches], len(bodies))


async def post_batches(
    url: str, batches: list[tuple[list[bytes], dict[str, str]]], events: int
) -> float:
    """Post each batch (its events, and headers of its own: an instance credential) signed
    as the webhook sink signs, from SENDERS senders; `events` per second. The senders are
    aiohttp's client (a keep-alive connection each): the load generator shares the host's
    cores with the fleet, and a lighter client leaves more of them to what is measured."""
    key = signing.standard_key(SECRET)
    queue: asyncio.Queue[tuple[list[bytes], dict[str, str]]] = asyncio.Queue()
    for batch in batches:
        queue.put_nowait(batch)
    connector = aiohttp.TCPConnector(limit=SENDERS)
    http = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60))

    async def sender() -> None:
        while not queue.empty():
            batch, extra = queue.get_nowait()
            body = b"[" + b",".join(batch) + b"]"
            msg_id = f"batch-{id(batch)}"
            headers = signing.standard_headers(msg_id, int(time.time()), body, [key])
            headers["content-type"] = "application/cloudevents-batch+json"
            async with http.post(url + "/v1/events", data=body, headers=headers | extra) as answer:
                text = await answer.read()
                if answer.status != 200:
                    raise RuntimeError(f"ingest answered {answer.status}: {text!r}")

    async with http:
        started = time.monotonic()
        await asyncio.gather(*(sender() for _ in range(SENDERS)))
        return events / (time.monotonic() - started)


@contextlib.asynccontextmanager
async def fleet_at(workdir: Path, extra: str, identity: str) -> AsyncIterator[str]:
    """A fleet service (`start_fleet`) on a free port: its URL; stopped on the way out."""
    port = free_port()
    proc = await start_fleet(workdir, port, extra, identity)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await proc.stop()


async def latency(
    url: str,
    path: str,
    requests: int,
    *,
    headers: dict[str, str] | None = None,
    budget: float | None = None,
) -> tuple[Summary, int]:
    """p50/p99 (ms) of `requests` sequential GETs of `path`, and the answer's size; with a
    `budget` (seconds), fewer (at least 5) when they would take longer than that."""
    samples: list[float] = []
    size = 0
    async with httpx.AsyncClient(base_url=url, timeout=120, headers=headers) as http:
        await http.get(path)  # warm up
        began = time.monotonic()
        for _ in range(requests):
            if budget is not None and len(samples) >= 5 and time.monotonic() - began > budget:
                break
            started = time.perf_counter()
            answer = await http.get(path)
            samples.append((time.perf_counter() - started) * 1000)
            if answer.status_code not in (200, 503):
                raise RuntimeError(f"{path} answered {answer.status_code}")
            size = len(answer.content)
    return summarize(samples), size


@contextlib.asynccontextmanager
async def fleet_ingested(
    sizes: Sizes, workdir: Path, bench: str
) -> AsyncIterator[tuple[str, Proc, float]]:
    """A fleet service in its own process holding the fleet of `sizes`, ingested over HTTP:
    its url, its process and the ingest rate (events/s). Stopped on the way out."""
    print(f"[{bench}] writing {sizes.events} events of {sizes.instances} VMs", file=sys.stderr)
    bodies = fleet_events(sizes, datetime.now(UTC))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = await start_fleet(workdir, port)
    try:
        print(f"[{bench}] ingesting over HTTP", file=sys.stderr)
        rate = await ingest(url, bodies)
        yield url, proc, rate
    finally:
        await proc.stop()


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def targets_table(rows: list[tuple[str, str, bool]]) -> list[str]:
    """The "## Targets" section of a fleet report: (target, measured, met) per row."""
    lines = ["## Targets", "", "| target | measured | verdict |", "| --- | --- | --- |"]
    return lines + [f"| {target} | {measured} | {_verdict(ok)} |" for target, measured, ok in rows]


def store_rows(counts: dict[str, int]) -> str:
    """The fleet store's row counts, as one line of a report."""
    return ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items()))


async def store_counts(url: str) -> dict[str, int]:
    async with httpx.AsyncClient(base_url=url) as http:
        counts: dict[str, int] = (await http.get("/v1/fleet/summary")).json()["store"]
    return counts


class Main(Protocol):
    def __call__(self, argv: list[str] | None = None) -> int: ...


def bench_main(
    name: str, doc: str | None, run: Callable[[Sizes, Path], Coroutine[Any, Any, str]]
) -> Main:
    """The `main` of `python -m bench.<name> [--quick] [--out DIR]` (this module and
    `bench.dashboard`): `run` at full or quick size in a temporary directory, its report
    written to `<name>.md` in `--out` (default bench/results) and printed."""

    def main(argv: list[str] | None = None) -> int:
        parser = argparse.ArgumentParser(prog=f"python -m bench.{name}", description=doc)
        parser.add_argument("--quick", action="store_true", help="tiny sizes: checks it runs")
        parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
        args = parser.parse_args(argv)
        sizes = QUICK if args.quick else FULL
        with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
            report = asyncio.run(run(sizes, Path(tmp)))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{name}.md").write_text(report)
        print(report)
        return 0

    return main


async def run(sizes: Sizes, workdir: Path) -> str:
    async with fleet_ingested(sizes, workdir, "bench.fleet") as (url, proc, rate):
        busy, quiet, other = _vm(20), _vm(1), _vm(40)  # every 20th VM has a notice in force
        paths = {
            "notices, all in force": "/v1/fleet/notices",
            "notices, one instance": f"/v1/fleet/notices?instance={busy.name}",
            "notices, one zone": f"/v1/fleet/notices?zone={busy.zone}",
            "eligible, 3 candidates": (
                f"/v1/fleet/eligible?instance={busy.name}&instance={quiet.name}"
                f"&instance={other.name}"
            ),
        }
        rows = []
        for label, path in paths.items():
            print(f"[bench.fleet] timing {label}", file=sys.stderr)
            summary, size = await latency(url, path, sizes.requests)
            rows.append((label, summary, size))
        counts = await store_counts(url)
        rss = proc.peak_rss_mb()
        cpu = proc.cpu_seconds()
    bodies = fleet_events(sizes, datetime.now(UTC))
    vms = [_vm(index) for index in range(sizes.instances)]
    arms = await fleet_identity.compare(bodies, vms, workdir, fleet_at, post_batches)
    return render(sizes, rate, rows, counts, rss, cpu, arms)


def render(
    sizes: Sizes,
    rate: float,
    rows: list[tuple[str, Summary, int]],
    counts: dict[str, int],
    rss: float,
    cpu: float,
    arms: fleet_identity.Arms,
) -> str:
    lines = [
        "# Fleet service benchmark",
        "",
        f"{sizes.instances:,} instances, {sizes.events:,} events (`python -m bench.fleet`); "
        f"the fleet service in its own process, SQLite store, signed `http` source. Commit "
        f"measured: {commit()}.",
        "",
        *targets_table(
            [
                (
                    f"HTTP batch ingest into SQLite >= {INGEST_TARGET:,.0f} events/s",
                    f"{rate:,.0f} events/s",
                    rate >= INGEST_TARGET,
                ),
                *(
                    (
                        f"{label}: p99 < {LATENCY_TARGET_MS:g} ms",
                        f"{summary.p99:.1f} ms",
                        summary.p99 < LATENCY_TARGET_MS,
                    )
                    for label, summary, _size in rows
                ),
                (
                    "ingest with identity required >= "
                    f"{fleet_identity.TARGET_RATIO:.0%} of the rate with it off",
                    f"{arms.ratio:.1%} ({arms.required:,.0f} vs {arms.off:,.0f} events/s)",
                    arms.ratio >= fleet_identity.TARGET_RATIO,
                ),
            ]
        ),
    ]
    lines += [
        "",
        "## API latency",
        "",
        "| request | p50 ms | p99 ms | max ms | answer bytes |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, summary, size in rows:
        lines.append(
            f"| {label} | {summary.p50:.1f} | {summary.p99:.1f} | {summary.max:.1f} | {size:,} |"
        )
    lines += fleet_identity.section(arms)
    lines += [
        "",
        "## Store and process",
        "",
        f"- rows: {store_rows(counts)}",
        f"- fleet service peak RSS: {rss:.0f} MiB; CPU time over the run: {cpu:.1f} s",
        f"- host: {os.cpu_count()} CPUs, load average {psutil.getloadavg()[0]:.1f} at the end "
        "(the machine may be shared: compare p50s, and p99s only on a quiet host)",
        f"- ingest: {SENDERS} concurrent senders, batches of {BATCH_SIZE} "
        "(the webhook sink's batch mode), each request one store transaction (fsync)",
        "",
    ]
    return "\n".join(lines)


main = bench_main("fleet", __doc__, run)


if __name__ == "__main__":
    sys.exit(main())
