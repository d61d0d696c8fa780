"""`python -m bench.fleet_ingest [--quick] [--events N] [--out FILE]`: how fast the fleet
service ingests from a bus and into each store.

Each run stores N distinct events (one maintenance transition each, spread over up to
10,000 instances) into a fresh store:

- **HTTP batch**: four concurrent clients POST batches of 100 to `/v1/events` (what the
  sidecars' webhook sink in batch mode sends);
- **Pub/Sub**: the events are published to Google's emulator first (not timed), then the
  fleet service's streaming pull consumes the backlog (timed from the source's start to the
  last commit);
- **Kafka**: the same with librdkafka's mock cluster (three brokers in this process, a
  topic of 16 partitions, as the mock brokers keep only a few MB per partition): the
  events are produced first in structured mode (not timed), then the fleet service's
  consumer group drains the backlog.

each into SQLite and into a real PostgreSQL server started from the machine's binaries
(`fsync=off`, so it is the fleet service that is measured, not this VM's disk). The fleet
service runs in this process; the emulator and PostgreSQL in their own. Figures are events
per second and the process's RSS after the run. A part whose server is missing here is
reported as skipped. Writes a Markdown table to `--out` (bench/results/fleet-ingest.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.drain import environment
from bench.procs import ROOT
from bridge.fleet.config import parse_fleet_config
from bridge.fleet.service import FleetService
from bridge.pipeline.model import Status
from tests.fleet.factories import T0, azure_vm, gce_vm, transition
from tests.support import eventually, free_port, running_as_root

BATCH = 100
CLIENTS = 4
INSTANCES = 10_000
KAFKA_PARTITIONS = 16


@dataclass(frozen=True)
class Figure:
    path: str
    store: str
    events: int
    seconds: float
    rss_mb: float

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("nan")


def events(count: int) -> list[bytes]:
    """`count` distinct transitions over up to INSTANCES VMs (half GCE, half Azure)."""
    bodies = []
    for index in range(count):
        number = index % INSTANCES
        vm = gce_vm(f"vm-{number}") if number % 2 else azure_vm(f"vm-{number}")
        at = T0 + timedelta(seconds=index)
        status = Status.SCHEDULED if index < INSTANCES else Status.STARTED
        bodies.append(transition(vm, f"n-{number}", status, at, not_before=T0))
    return bodies


def rss_mb() -> float:
    return float(psutil.Process().memory_info().rss) / 2**20


@asynccontextmanager
async def service(url: str, sources: list[dict[str, Any]]) -> AsyncIterator[FleetService]:
    raw = {"fleet": {"listener": {"port": 0}, "store": {"url": url}, "sources": sources}}
    fleet = FleetService(parse_fleet_config(raw))
    async with fleet.running():
        yield fleet


async def stored(fleet: FleetService, count: int, timeout: float) -> None:
    async def done() -> bool:
        return (await fleet.store.counts())["events"] >= count

    await eventually(done, timeout=timeout)


async def http_batch(url: str, store: str, bodies: list[bytes]) -> Figure:
    batches = [b"[" + b",".join(bodies[i : i + BATCH]) + b"]" for i in range(0, len(bodies), BATCH)]
    headers = {"content-type": "application/cloudevents-batch+json"}
    async with service(url, [{"type": "http"}]) as fleet:
        async with httpx.AsyncClient(base_url=fleet.url, timeout=60) as client:

            async def post(share: list[bytes]) -> None:
                for body in share:
                    response = await client.post("/v1/events", content=body, headers=headers)
                    response.raise_for_status()

            began = time.perf_counter()
            await asyncio.gather(*(post(batches[i::CLIENTS]) for i in range(CLIENTS)))
            seconds = time.perf_counter() - began
        return Figure("HTTP batch (4 clients x 100)", store, len(bodies), seconds, rss_mb())


async def pubsub(url: str, store: str, bodies: list[bytes], emulator: Any) -> Figure:
    from tests.sinks.pubsub_emulator import Admin, unique

    admin = Admin(emulator)
    topic, subscription = admin.topic_path(unique("fleet")), admin.subscription_path(unique("f"))
    try:
        await asyncio.to_thread(admin.create, topic, subscription, False)

        def publish() -> None:
            futures = [admin.publisher.publish(topic, body) for body in bodies]
            for future in futures:
                future.result(60)

        await asyncio.to_thread(publish)
        source = {"type": "pubsub", "subscription": subscription, "max_outstanding": 5000}
        began = time.perf_counter()
        async with service(url, [source]) as fleet:
            await stored(fleet, len(bodies), timeout=600)
            seconds = time.perf_counter() - began
        return Figure("Pub/Sub streaming pull", store, len(bodies), seconds, rss_mb())
    finally:
        admin.close()


async def kafka(url: str, store: str, bodies: list[bytes], cluster: Any) -> Figure:
    from confluent_kafka import Consumer, Producer, TopicPartition

    from bridge.transports.kafka_binding import CONTENT_TYPE_HEADER, STRUCTURED_CONTENT_TYPE

    topic = cluster.create_topic(partitions=KAFKA_PARTITIONS)

    def produce() -> None:
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})
        headers: list[tuple[str, str | bytes | None]] = [
            (CONTENT_TYPE_HEADER, STRUCTURED_CONTENT_TYPE.encode())
        ]
        for index, body in enumerate(bodies):
            producer.produce(topic, body, str(index % INSTANCES).encode(), headers=headers)
            producer.poll(0)
        assert producer.flush(60) == 0
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "bench"})
        for partition in range(KAFKA_PARTITIONS):
            low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)
            if low:  # the mock broker dropped the oldest messages: the run cannot finish
                raise RuntimeError(f"the mock cluster truncated partition {partition}")
        consumer.close()

    await asyncio.to_thread(produce)
    source = {
        "type": "kafka",
        "bootstrap_servers": [cluster.bootstrap],
        "topic": topic,
        "group_id": f"fleet-{topic}",  # a fresh group: no departed member to wait out
    }
    began = time.perf_counter()
    async with service(url, [source]) as fleet:
        await stored(fleet, len(bodies), timeout=600)
        seconds = time.perf_counter() - began
    return Figure("Kafka consumer group", store, len(bodies), seconds, rss_mb())


@asynccontextmanager
async def stores(tmp: Path) -> AsyncIterator[list[tuple[str, Callable[[], str]]]]:
    """(name, a new store URL each call) for SQLite and, when its binaries are here,
    PostgreSQL."""
    from tests.fleet.postgres_server import PostgresServer, find_bindir

    counter = iter(range(1_000_000))
    found: list[tuple[str, Callable[[], str]]] = [
        ("SQLite", lambda: f"sqlite://{tmp / f'fleet-{next(counter)}.sqlite3'}")
    ]
    bindir = find_bindir()
    server: PostgresServer | None = None
    if bindir is not None:
        directory = Path(tempfile.mkdtemp(prefix="bench-postgres-"))
        if running_as_root():
            shutil.chown(directory, "nobody")
        server = PostgresServer(bindir, directory, free_port())
        await asyncio.to_thread(server.start)
        found.append(("PostgreSQL", server.create_database))
    try:
        yield found
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)
            shutil.rmtree(server.directory, ignore_errors=True)


async def run(count: int) -> tuple[list[Figure], list[str]]:
    from tests.sinks.kafka_mock import MockCluster, library
    from tests.sinks.pubsub_emulator import Emulator, find_script

    figures: list[Figure] = []
    notes: list[str] = []
    bodies = events(count)
    script = find_script()
    emulator = Emulator(script) if script is not None else None
    if emulator is None:
        notes.append("Pub/Sub: skipped, the emulator (Google Cloud CLI + Java) is not installed")
    else:
        await asyncio.to_thread(emulator.start)
    lib = library()
    cluster = MockCluster(lib) if lib is not None else None
    if cluster is None:
        notes.append("Kafka: skipped, confluent-kafka (the kafka extra) is not installed")
    else:
        cluster.start()
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        try:
            async with stores(Path(tmp)) as available:
                if len(available) == 1:
                    notes.append("PostgreSQL: skipped, initdb/pg_ctl are not installed")
                for name, new_url in available:
                    figures.append(await http_batch(new_url(), name, bodies))
                    if emulator is not None:
                        with environment("PUBSUB_EMULATOR_HOST", emulator.host):
                            figures.append(await pubsub(new_url(), name, bodies, emulator))
                    if cluster is not None:
                        figures.append(await kafka(new_url(), name, bodies, cluster))
        finally:
            if emulator is not None:
                await asyncio.to_thread(emulator.stop)
            if cluster is not None:
                cluster.stop()
    return figures, notes


def render(figures: list[Figure], notes: list[str], cores: int, load: float) -> str:
    lines = [
        "# Fleet service: ingest rate",
        "",
        f"`python -m bench.fleet_ingest` on {cores} core(s), host load {load:.1f} at the start",
        "(other programs share the host: compare runs at a similar load). Distinct events into",
        "a fresh store, the fleet service in the benchmark's process. RSS is the process after",
        "the run (cumulative over the runs above it).",
        "",
        "| path | store | events | seconds | events/s | RSS MB |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for f in figures:
        lines.append(
            f"| {f.path} | {f.store} | {f.events} | {f.seconds:.2f} | {f.rate:,.0f} | "
            f"{f.rss_mb:.0f} |"
        )
    lines += [""] + [f"- {note}" for note in notes]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_ingest", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="500 events: checks it runs")
    parser.add_argument("--events", type=int, help="events per run (default 20,000)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "fleet-ingest.md")
    args = parser.parse_args(argv)
    count = args.events or (500 if args.quick else 20_000)
    load = psutil.getloadavg()[0]
    figures, notes = asyncio.run(run(count))
    text = render(figures, notes, os.cpu_count() or 1, load)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
