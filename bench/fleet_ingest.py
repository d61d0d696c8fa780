"""`python -m bench.fleet_ingest [--quick] [--events N] [--paths ...] [--stores ...] [--out FILE]`:
how fast the fleet service ingests from a bus and into each store.

Each run stores N distinct events (one maintenance transition each, spread over up to
10,000 instances) into a fresh store:

- **HTTP batch**: four concurrent clients POST batches of 100 to `/v1/events` (what the
  sidecars' webhook sink in batch mode sends);
- **Pub/Sub**: the events are published to Google's emulator first (not timed), then the
  fleet service's `pubsub` source pulls the backlog (timed from the source's start to the
  last commit);
- **Event Hubs**: the sidecars' own Event Hubs sink sends the backlog to the test AMQP
  server (`tests/sinks/eventhub_server.py`, 4 partitions, in a process of its own as the
  real service is elsewhere; not timed), then the fleet service's `eventhubs` source drains
  it;
- **Kafka**: the same with librdkafka's mock cluster (three brokers in a process of their
  own, a topic of 16 partitions, as the mock brokers keep only a few MB per partition): the
  events are produced first in structured mode, as the sidecars' Kafka sink writes them
  (not timed), then the fleet service's consumer group drains the backlog.

each into SQLite and into a real PostgreSQL server started from the machine's binaries
(`fsync=off`, so it is the fleet service that is measured, not this VM's disk). The fleet
service runs in this process; the emulator, the Kafka brokers and PostgreSQL in their own.
Figures are events per second, the CPU seconds this process spent during the run (the
fleet service) and per event, those of the Event Hubs source's receiver process (the AMQP
client, in a process of the fleet service's own), those the Pub/Sub emulator, the Event
Hubs test server or the Kafka mock brokers spent (their own processes), and the process's
RSS after the run. A
part whose server is missing here is reported as skipped. Writes a Markdown table to
`--out` (bench/results/fleet-ingest.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

import httpx
import psutil

from bench.drain import environment
from bench.procs import ROOT, commit
from bridge.fleet.config import parse_fleet_config
from bridge.fleet.service import FleetService
from bridge.fleet.sources.eventhubs_receiver import Channel
from bridge.pipeline.model import Status
from tests.fleet.factories import T0, azure_vm, gce_vm, transition
from tests.support import eventually, free_port, running_as_root

BATCH = 100
CLIENTS = 4
INSTANCES = 10_000
KAFKA_PARTITIONS = 16
EVENTHUB_PARTITIONS = 4


PATHS: Final = ("http", "pubsub", "eventhubs", "kafka")
#: Keys every bus source of the run gets (`--batch-size`); the bare rows take them too.
SOURCE_OPTIONS: dict[str, Any] = {}
STORES: Final = ("sqlite", "postgresql")


@dataclass(frozen=True)
class Figure:
    path: str
    store: str
    events: int
    seconds: float
    rss_mb: float
    #: CPU seconds of this process during the run (None: not measured).
    cpu_s: float | None = None
    #: CPU seconds of the bus's server when it runs in a process of its own (the emulator).
    server_cpu_s: float | None = None
    #: CPU seconds of the fleet service's own receiver process (Event Hubs), its whole life.
    receiver_cpu_s: float | None = None

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


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of this process alone (not its children: the emulator,
    PostgreSQL), or of process `pid` and its children."""
    if pid is None:
        times = psutil.Process().cpu_times()
        return times.user + times.system
    process = psutil.Process(pid)
    total = 0.0
    for each in [process, *process.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = each.cpu_times()
            total += times.user + times.system
    return total


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


async def pubsub(url: str | None, store: str, bodies: list[bytes], emulator: Any) -> Figure:
    """The fleet service's `pubsub` source drains the backlog into the store at `url`; None:
    bare pulls of the same client library and batch size, each batch acknowledged at once
    (no store, no fleet: what the emulator and the client library allow here)."""
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
        server = emulator_pid(emulator)
        began, cpu, server_cpu = time.perf_counter(), cpu_seconds(), cpu_seconds(server)
        if url is None:
            await asyncio.to_thread(bare_pull, subscription, len(bodies))
            seconds = time.perf_counter() - began
            spent = cpu_seconds() - cpu, cpu_seconds(server) - server_cpu
            return Figure(
                "Pub/Sub bare client (no store)", store, len(bodies), seconds, rss_mb(), *spent
            )
        source = {"type": "pubsub", "subscription": subscription, **SOURCE_OPTIONS}
        async with service(url, [source]) as fleet:
            await stored(fleet, len(bodies), timeout=600)
            seconds = time.perf_counter() - began
            spent = cpu_seconds() - cpu, cpu_seconds(server) - server_cpu
        return Figure("Pub/Sub pull", store, len(bodies), seconds, rss_mb(), *spent)
    finally:
        admin.close()


def bare_pull(subscription: str, count: int) -> None:
    """Pulls of the source's batch size, each acknowledged at once, as the source pulls."""
    from google.cloud import pubsub_v1  # type: ignore[import-untyped]

    from bridge.fleet.bus_config import PubsubSourceConfig

    size = PubsubSourceConfig(subscription=subscription, **SOURCE_OPTIONS).batch_size
    subscriber = pubsub_v1.SubscriberClient()
    seen = 0
    deadline = time.monotonic() + 600
    try:
        while seen < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the bare pull got {seen} of {count} messages")
            answer = subscriber.pull(
                request={"subscription": subscription, "max_messages": size}, timeout=10
            )
            ack_ids = [m.ack_id for m in answer.received_messages]
            if ack_ids:
                subscriber.acknowledge(request={"subscription": subscription, "ack_ids": ack_ids})
                seen += len(ack_ids)
    finally:
        subscriber.close()


async def kafka(url: str | None, store: str, bodies: list[bytes], cluster: Any) -> Figure:
    """The fleet service's `kafka` source drains the backlog into the store at `url`; None:
    a bare consumer of the same library and settings, committing each batch's offsets (no
    store, no fleet)."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from bridge.pipeline.events import parse
    from bridge.transports.kafka_binding import to_record

    topic = cluster.create_topic(partitions=KAFKA_PARTITIONS)

    def produce() -> None:
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})
        for body in bodies:  # as the sidecars' Kafka sink writes them
            record = to_record(parse(body), "structured")
            headers: list[tuple[str, str | bytes | None]] = list(record.headers)
            producer.produce(topic, record.value, record.key, headers=headers)
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
        **SOURCE_OPTIONS,
    }
    server = getattr(cluster, "pid", None)  # None: the brokers run in this process
    began, cpu = time.perf_counter(), cpu_seconds()
    server_cpu = cpu_seconds(server) if server is not None else None

    def spent() -> tuple[float, float | None]:
        brokers = cpu_seconds(server) - server_cpu if server_cpu is not None else None
        return cpu_seconds() - cpu, brokers

    if url is None:
        await asyncio.to_thread(bare_consume, source, len(bodies))
        seconds = time.perf_counter() - began
        path = "Kafka bare consumer (no store)"
        return Figure(path, store, len(bodies), seconds, rss_mb(), *spent())
    async with service(url, [source]) as fleet:
        await stored(fleet, len(bodies), timeout=600)
        seconds, used = time.perf_counter() - began, spent()
    return Figure("Kafka consumer group", store, len(bodies), seconds, rss_mb(), *used)


class KafkaProcess:
    """librdkafka's mock cluster in a process of its own, as the brokers are elsewhere (their
    CPU is theirs, not the fleet service's): `MockCluster`'s `start`, `stop`, `bootstrap` and
    `create_topic`, and `pid`."""

    def __init__(self) -> None:
        self.bootstrap = ""
        self.pid: int | None = None
        self._process: Any = None
        self._pipe: Channel | None = None

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        self._process = context.Process(target=serve_kafka, args=(theirs,), daemon=True)
        self._process.start()
        theirs.close()
        if not ours.poll(120):
            raise RuntimeError("the Kafka mock cluster did not start")
        self._pipe, self.bootstrap, self.pid = ours, ours.recv(), self._process.pid

    def create_topic(self, name: str | None = None, partitions: int = 4) -> str:
        assert self._pipe is not None
        self._pipe.send((name, partitions))
        topic: str = self._pipe.recv()
        return topic

    def stop(self) -> None:
        pipe, process, self._pipe, self._process = self._pipe, self._process, None, None
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.send(None)
            pipe.close()
        if process is not None:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(10)


def serve_kafka(pipe: Connection) -> None:
    """In a process of its own: the mock cluster, its bootstrap address sent through `pipe`,
    then a topic created for each (name, partitions) that comes, until None comes."""
    from tests.sinks.kafka_mock import MockCluster, require_library

    cluster = MockCluster(require_library())
    cluster.start()
    try:
        pipe.send(cluster.bootstrap)
        while (request := pipe.recv()) is not None:
            name, partitions = request
            pipe.send(cluster.create_topic(name, partitions))
    finally:
        cluster.stop()


def bare_consume(source: dict[str, Any], count: int) -> None:
    """A plain consumer with the source's settings and batch size, committing offsets."""
    from confluent_kafka import Consumer

    from bridge.fleet.kafka_config import KafkaSourceConfig
    from bridge.infra.validation import validate

    config = validate(KafkaSourceConfig, source)
    consumer = Consumer(config.consumer_settings())
    consumer.subscribe([source["topic"]])
    seen = 0
    deadline = time.monotonic() + 600
    try:
        while seen < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the bare consumer got {seen} of {count} messages")
            messages = [m for m in consumer.consume(config.batch_size, 0.5) if m.error() is None]
            if messages:
                seen += len(messages)
                consumer.commit(asynchronous=False)
    finally:
        consumer.close()


async def eventhubs(url: str | None, store: str, bodies: list[bytes]) -> Figure:
    """A backlog sent by the sidecars' own Event Hubs sink to the test AMQP server (in a
    process of its own), drained by the fleet service's `eventhubs` source into the store at
    `url`; None: by a bare `receive_batch` of the same client and settings (no store, no
    fleet)."""
    from bridge.infra.validation import validate
    from bridge.pipeline.events import parse
    from bridge.sinkapi import Ok
    from sinks.eventhubs import Config as SinkConfig
    from sinks.eventhubs import create

    async with hub_process(EVENTHUB_PARTITIONS) as (connection_string, server):
        settings = {"type": "eventhubs", "connection_string": connection_string}
        sink = create(validate(SinkConfig, settings), "eventhubs")
        try:
            for index in range(0, len(bodies), 500):
                chunk = [parse(body) for body in bodies[index : index + 500]]
                if not isinstance(await sink.publish(chunk), Ok):
                    raise RuntimeError("the Event Hubs sink could not send the backlog")
        finally:
            await sink.close(5.0)
        source = {
            "type": "eventhubs",
            "connection_string": connection_string,
            "consumer_group": "fleet",
            **SOURCE_OPTIONS,
        }
        began, cpu, server_cpu = time.perf_counter(), cpu_seconds(), cpu_seconds(server)
        if url is None:
            await bare_receive(source, len(bodies))
            seconds = time.perf_counter() - began
            spent = cpu_seconds() - cpu, cpu_seconds(server) - server_cpu
            path = "Event Hubs bare client (no store)"
            return Figure(path, store, len(bodies), seconds, rss_mb(), *spent)
        async with service(url, [source]) as fleet:
            await stored(fleet, len(bodies), timeout=600)
            seconds = time.perf_counter() - began
            spent = cpu_seconds() - cpu, cpu_seconds(server) - server_cpu
            receiver = getattr(fleet.sources[0], "receiver_pid", None)
            receiver_cpu = cpu_seconds(receiver) if receiver is not None else None
    path = "Event Hubs (test AMQP server)"
    return Figure(path, store, len(bodies), seconds, rss_mb(), *spent, receiver_cpu)


def serve_hub(pipe: Connection, partitions: int) -> None:
    """In a process of its own: the test Event Hubs server, its connection string sent
    through `pipe`, until something comes back through it."""
    from tests.sinks.eventhub_server import EventHubServer

    async def serve() -> None:
        async with EventHubServer(partitions=partitions) as hub:
            pipe.send(hub.connection_string)
            await asyncio.to_thread(pipe.recv)

    asyncio.run(serve())


@asynccontextmanager
async def hub_process(partitions: int) -> AsyncIterator[tuple[str, int]]:
    """The test Event Hubs server in a process of its own (as the service is elsewhere, its
    CPU is the server's, not the fleet's): its connection string and process id."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=serve_hub, args=(theirs, partitions), daemon=True)
    process.start()
    try:
        if not await asyncio.to_thread(ours.poll, 120):
            raise RuntimeError("the Event Hubs test server did not start")
        connection_string: str = ours.recv()
        assert process.pid is not None
        yield connection_string, process.pid
    finally:
        with contextlib.suppress(OSError):
            ours.send(None)
        await asyncio.to_thread(process.join, 10)
        if process.is_alive():
            process.kill()
            await asyncio.to_thread(process.join, 10)


async def bare_receive(source: dict[str, Any], count: int) -> None:
    """A plain `receive_batch` with the source's batch size and prefetch, from the start."""
    from azure.eventhub.aio import EventHubConsumerClient

    from bridge.fleet.bus_config import EventHubsSourceConfig
    from bridge.fleet.sources.eventhubs_receiver import PREFETCH_BATCHES
    from bridge.infra.validation import validate
    from bridge.transports.eventhubs import open_client

    config = validate(EventHubsSourceConfig, source)
    client, _ = open_client(EventHubConsumerClient, config, consumer_group=config.consumer_group)
    done = asyncio.Event()
    seen = [0]

    async def on_batch(_context: Any, events: list[Any]) -> None:
        seen[0] += len(events)
        if seen[0] >= count:
            done.set()

    receiving = asyncio.create_task(
        client.receive_batch(
            on_batch,
            max_batch_size=config.batch_size,
            prefetch=config.batch_size * PREFETCH_BATCHES,
            starting_position="-1",
        )
    )
    try:
        await asyncio.wait_for(done.wait(), 600)
    finally:
        await client.close()
        receiving.cancel()
        await asyncio.gather(receiving, return_exceptions=True)


def emulator_pid(emulator: Any) -> int | None:
    """The emulator's launcher process (its Java server is a child of it)."""
    proc = getattr(emulator, "_proc", None)
    return proc.pid if proc is not None else None


@asynccontextmanager
async def stores(
    tmp: Path, postgresql: bool = True
) -> AsyncIterator[list[tuple[str, Callable[[], str]]]]:
    """(name, a new store URL each call) for SQLite and, when its binaries are here (and
    `postgresql`), PostgreSQL."""
    from tests.fleet.postgres_server import PostgresServer, find_bindir

    counter = iter(range(1_000_000))
    found: list[tuple[str, Callable[[], str]]] = [
        ("SQLite", lambda: f"sqlite://{tmp / f'fleet-{next(counter)}.sqlite3'}")
    ]
    bindir = find_bindir() if postgresql else None
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


async def run(
    count: int, paths: tuple[str, ...] = PATHS, kinds: tuple[str, ...] = STORES, bare: bool = False
) -> tuple[list[Figure], list[str]]:
    from tests.sinks.kafka_mock import library
    from tests.sinks.pubsub_emulator import Emulator, find_script

    figures: list[Figure] = []
    notes: list[str] = []
    bodies = events(count)
    script = find_script() if "pubsub" in paths else None
    emulator = Emulator(script) if script is not None else None
    if emulator is None and "pubsub" in paths:
        notes.append("Pub/Sub: skipped, the emulator (Google Cloud CLI + Java) is not installed")
    elif emulator is not None:
        await asyncio.to_thread(emulator.start)
    lib = library() if "kafka" in paths else None
    cluster = KafkaProcess() if lib is not None else None
    if cluster is None and "kafka" in paths:
        notes.append("Kafka: skipped, confluent-kafka (the kafka extra) is not installed")
    elif cluster is not None:
        cluster.start()
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        try:
            if bare:  # each bus's ceiling here: its client alone, no store, no fleet
                if emulator is not None:
                    with environment("PUBSUB_EMULATOR_HOST", emulator.host):
                        figures.append(await pubsub(None, "none", bodies, emulator))
                if "eventhubs" in paths:
                    figures.append(await eventhubs(None, "none", bodies))
                if cluster is not None:
                    figures.append(await kafka(None, "none", bodies, cluster))
            async with stores(Path(tmp), "postgresql" in kinds) as available:
                if len(available) == 1 and "postgresql" in kinds:
                    notes.append("PostgreSQL: skipped, initdb/pg_ctl are not installed")
                for name, new_url in available:
                    if name.lower() not in kinds:
                        continue
                    if "http" in paths:
                        figures.append(await http_batch(new_url(), name, bodies))
                    if emulator is not None:
                        with environment("PUBSUB_EMULATOR_HOST", emulator.host):
                            figures.append(await pubsub(new_url(), name, bodies, emulator))
                    if "eventhubs" in paths:
                        figures.append(await eventhubs(new_url(), name, bodies))
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
        f"`python -m bench.fleet_ingest` at commit {commit()} on {cores} core(s), host load "
        f"{load:.1f} at the start",
        "(other programs share the host: compare runs at a similar load). Distinct events into",
        "a fresh store, the fleet service in the benchmark's process. RSS is the process after",
        "the run (cumulative over the runs above it). CPU s: this process (the fleet service)",
        "during the run, and per event; receiver CPU s: the Event Hubs source's receiver",
        "process (the AMQP client; its whole life, imports included); server CPU s: the Pub/Sub",
        "emulator's, the Event Hubs test server's or the Kafka mock brokers' own process. A",
        "`bare` row (store `none`) drains the same backlog with the bus's client library alone:",
        "the ceiling here.",
        "",
        "| path | store | events | seconds | events/s | CPU s | CPU us/event | receiver CPU s "
        "| server CPU s | RSS MB |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for f in figures:
        cpu = "" if f.cpu_s is None else f"{f.cpu_s:.1f}"
        per_event = "" if f.cpu_s is None else f"{f.cpu_s / f.events * 1e6:.0f}"
        receiver = "" if f.receiver_cpu_s is None else f"{f.receiver_cpu_s:.1f}"
        server = "" if f.server_cpu_s is None else f"{f.server_cpu_s:.1f}"
        lines.append(
            f"| {f.path} | {f.store} | {f.events} | {f.seconds:.2f} | {f.rate:,.0f} | "
            f"{cpu} | {per_event} | {receiver} | {server} | {f.rss_mb:.0f} |"
        )
    lines += [""] + [f"- {note}" for note in notes]
    return "\n".join(lines).rstrip() + "\n"


def _choices(
    parser: argparse.ArgumentParser, flag: str, value: str, known: tuple[str, ...]
) -> tuple[str, ...]:
    chosen = tuple(v.strip().lower() for v in value.split(",") if v.strip())
    unknown = [v for v in chosen if v not in known]
    if unknown or not chosen:
        parser.error(f"{flag}: expected some of {', '.join(known)}, got {value!r}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_ingest", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="500 events: checks it runs")
    parser.add_argument("--events", type=int, help="events per run (default 20,000)")
    parser.add_argument(
        "--paths",
        default=",".join(PATHS),
        help=f"comma-separated, of {', '.join(PATHS)} (default: all)",
    )
    parser.add_argument(
        "--stores",
        default=",".join(STORES),
        help=f"comma-separated, of {', '.join(STORES)} (default: both)",
    )
    parser.add_argument(
        "--bare",
        action="store_true",
        help="also drain each bus's backlog with its client library alone (no store, no "
        "fleet): the ceiling the bus's server and client allow on this machine",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        help="the bus sources' batch_size (default: theirs, 500): messages per transaction",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "fleet-ingest.md")
    args = parser.parse_args(argv)
    count = args.events or (500 if args.quick else 20_000)
    if args.batch_size:
        SOURCE_OPTIONS["batch_size"] = args.batch_size
    paths = _choices(parser, "--paths", args.paths, PATHS)
    kinds = _choices(parser, "--stores", args.stores, STORES)
    load = psutil.getloadavg()[0]
    figures, notes = asyncio.run(run(count, paths, kinds, args.bare))
    text = render(figures, notes, os.cpu_count() or 1, load)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
