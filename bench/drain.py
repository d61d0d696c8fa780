"""The spool: what a notice pays to be on disk before any send, and how fast a backlog drains.

Runs the real `Spool`, `Dispatcher` and sinks in this process (no watcher: the backlog is
committed up front, as after a long outage) against the receiver process or the Pub/Sub
emulator. The rate is events acknowledged per second, from the dispatcher's start until
the last acknowledgement. Next to each drain into a plain `http.server` receiver (keep-alive
answering 204; HTTP/1.0 answering 200 with a body, a connection per request), the
yardsticks: a plain synchronous client (`http.client`) POSTing the same events, one per
request, to the same receiver, with no spool behind it, and the bridge's HTTP client alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import gc
import http.client
import os
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.profiles import by_package
from bench.spans import timing
from bridge.config import parse_config
from bridge.infra.http1 import Http1Client
from bridge.pipeline.dispatch import Dispatcher
from bridge.pipeline.events import serialize
from bridge.pipeline.spool import NewEvent, Spool
from bridge.runner import build_sinks
from sinks.webhook import STRUCTURED_CONTENT_TYPE
from tests.factories import sample_events

#: The yardsticks' names in the report (`yardstick` adds the receiver they ran against).
SYNC_CLIENT = (
    "a plain synchronous client (http.client, its connection kept while the server keeps it)"
)
HTTP1_ALONE = "the bridge's HTTP client alone (bridge.http1, the same)"


def yardstick(client: str, receiver: str) -> str:
    """The name of `client`'s yardstick run against `receiver` (a label of `bench.report`)."""
    return f"{client}, to the {receiver} receiver"


@dataclass
class Drain:
    name: str
    events: int
    per_second: float


async def commit_latency(count: int) -> list[float]:
    """Milliseconds per single-event durable commit (what a notice pays before any send)."""
    with tempfile.TemporaryDirectory() as directory:
        spool = Spool(Path(directory), ["webhook"])
        await spool.open()
        timings: list[float] = []
        for event in sample_events(count):
            row = NewEvent(event.get_id(), event.get_source(), event.get_type(), serialize(event))
            started = time.perf_counter()
            await spool.commit([row], {"bench": {"n": len(timings)}})
            timings.append((time.perf_counter() - started) * 1000)
        await spool.close()
    return timings


#: Bytes a notice's commit adds to the WAL (its frames: the event, its queue rows, the
#: watcher's checkpoint, the notice in force), what `disk_floor` writes per sync.
COMMIT_BYTES = 10 * (4096 + 24)
#: The two ways a commit's bytes reach the disk (`disk_floor`).
REWRITTEN, APPENDED = "rewritten in place", "appended"


def disk_floor(count: int, directory: Path | None = None) -> dict[str, list[float]]:
    """Milliseconds per fdatasync of `COMMIT_BYTES` just written, with nothing else around
    it (no SQLite, no thread, no event loop): what the disk alone costs a notice. Written
    into blocks the file already has (a WAL SQLite writes again from its beginning after a
    checkpoint) and appended (a WAL that grows: the file system's journal commits its size
    and blocks too). The two alternate, 5 ms apart, as notices come with pauses between
    them. Blocking: run it in a thread."""
    sync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)
    block = os.urandom(COMMIT_BYTES)
    span = 100 * COMMIT_BYTES
    timings: dict[str, list[float]] = {REWRITTEN: [], APPENDED: []}
    with tempfile.TemporaryDirectory(dir=directory) as where:
        files = {name: os.open(Path(where) / str(i), os.O_RDWR | os.O_CREAT)
                 for i, name in enumerate(timings)}  # fmt: skip
        try:
            os.write(files[REWRITTEN], bytes(span))
            os.fsync(files[REWRITTEN])
            for n in range(count):
                for name, fd in files.items():
                    time.sleep(0.005)
                    offset = (n * COMMIT_BYTES) % span if name == REWRITTEN else n * COMMIT_BYTES
                    os.lseek(fd, offset, os.SEEK_SET)
                    os.write(fd, block)
                    started = time.perf_counter()
                    sync(fd)
                    timings[name].append((time.perf_counter() - started) * 1000)
        finally:
            for fd in files.values():
                os.close(fd)
    return timings


async def drain(name: str, sink: dict[str, Any], total: int) -> Drain:
    """Events per second delivered to `sink` from a spool holding `total` events."""
    config = parse_config({"sinks": [sink]})
    sinks = build_sinks(config)
    with tempfile.TemporaryDirectory() as directory:
        spool = Spool(Path(directory), [s.name for s in sinks])
        await spool.open()
        events = sample_events(total)
        rows = [NewEvent(e.get_id(), e.get_source(), e.get_type(), serialize(e)) for e in events]
        for start in range(0, total, 500):
            await spool.commit(rows[start : start + 500])
        # The backlog now lives in the spool only, as after an outage: the benchmark's own
        # copies would otherwise make every garbage collection of the drain scan them.
        del events, rows
        gc.collect()
        # A bridge runs in a process of its own; this drain runs in the driver, whose heap
        # holds what the earlier parts of a run left (simulators, request logs, results).
        # Frozen out of the collections, it no longer slows the drain down by the part's
        # place in the run (a full run measured 1,692 ev/s where the part alone made 2,976).
        gc.freeze()
        try:
            dispatcher = Dispatcher(spool, sinks)
            started = time.perf_counter()
            dispatcher.start()
            dispatcher.notify()
            stats = dispatcher.stats[sinks[0].name]
            deadline = started + max(60.0, total / 50)
            while stats.delivered < total:
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"{name}: only {stats.delivered} of {total} delivered")
                await asyncio.sleep(0.01)
            elapsed = time.perf_counter() - started
            await dispatcher.stop(5.0)
        finally:
            gc.unfreeze()
        await spool.close()
    return Drain(name, total, total / elapsed)


def _structured(total: int) -> tuple[list[bytes], dict[str, str]]:
    """`total` structured-mode bodies and the headers the webhook sink sends with them."""
    bodies = [serialize(event) for event in sample_events(total)]
    return bodies, {"content-type": STRUCTURED_CONTENT_TYPE, "user-agent": "bench"}


def sync_client(url: str, total: int, name: str = SYNC_CLIENT) -> Drain:
    """Requests per second of `http.client` POSTing `total` structured events one by one on
    one kept connection (a new one whenever the server closes it; blocking: run it in a
    thread), each answer read in full."""
    parts = urlsplit(url)
    bodies, headers = _structured(total)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80)
    try:
        started = time.perf_counter()
        for body in bodies:
            connection.request("POST", parts.path, body=body, headers=headers)
            answer = connection.getresponse()
            answer.read()
            if answer.status >= 300:
                raise RuntimeError(f"{name}: HTTP {answer.status}")
        elapsed = time.perf_counter() - started
    finally:
        connection.close()
    return Drain(name, total, total / elapsed)


async def client_alone(url: str, total: int, name: str = HTTP1_ALONE) -> Drain:
    """The same as `sync_client` with the bridge's own HTTP client and nothing else of the
    bridge (no spool, no dispatcher, no sink): how much of a drain's gap is the client's."""
    bodies, headers = _structured(total)
    client = Http1Client(url, timeout=10.0, user_agent=headers.pop("user-agent"))
    try:
        started = time.perf_counter()
        for body in bodies:
            answer = await client.request("POST", body=body, headers=headers)
            if answer.status >= 300:
                raise RuntimeError(f"{name}: HTTP {answer.status}")
        elapsed = time.perf_counter() - started
    finally:
        await client.aclose()
    return Drain(name, total, total / elapsed)


#: What a drain's time per event is spent on, timed in this process (`bench.spans.timing`).
DRAIN_STEPS = {
    (
        "bridge.pipeline.dispatch",
        "Dispatcher",
        "_deliver",
    ): "delivery: encode, the HTTP exchange",
    ("bridge.infra.http1", "Http1Client", "request"): "  of which the HTTP exchange",
    ("bridge.pipeline.spool", "Spool", "pending"): "spool reads (windows of pending events)",
    ("bridge.pipeline.spool", "Spool", "ack"): "acknowledgements (spool transactions, written "
    "in the background while the next window is sent: not part of the sum)",
}
#: The steps that overlap the others (not added up).
_CONCURRENT = {"request", "ack"}


async def drain_steps(sink: dict[str, Any], total: int) -> list[str]:
    """Where a drain's wall time goes, per event: a CPU profile cannot tell waiting (the
    receiver's turn, a spool transaction) from work, these timings can."""
    with timing(DRAIN_STEPS) as durations:
        result = await drain("steps", sink, total)
    per_event = 1e6 / result.per_second
    lines = [f"where a drain's time goes, per event ({result.per_second:,.0f} ev/s, "
             f"{per_event:.0f} us an event):"]  # fmt: skip
    accounted = 0.0
    for (_, _, method), step in DRAIN_STEPS.items():
        spent = sum(durations[step]) / total * 1e6
        accounted += 0.0 if method in _CONCURRENT else spent
        lines.append(f"  {spent:6.0f} us  {step}")
    lines.append(f"  {per_event - accounted:6.0f} us  the rest (the worker's loop, waiting)")
    return lines


async def profile_drain(sink: dict[str, Any], total: int) -> list[str]:
    """Where a drain spends its CPU: cProfile, summed by package."""
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        await drain("profile", sink, total)
    finally:
        profiler.disable()
    return ["the same drain under cProfile:", *by_package(pstats.Stats(profiler), total, "event")]


@contextlib.contextmanager
def environment(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


async def pubsub(total: int) -> Drain | str:
    """Drain to Google's Pub/Sub emulator; a reason string when it cannot run here."""
    from tests.sinks.pubsub_emulator import Admin, Emulator, find_script, unique

    script = find_script()
    if script is None:
        return "skipped: the Pub/Sub emulator (Google Cloud CLI + Java) is not installed"
    emulator = Emulator(script)
    await asyncio.to_thread(emulator.start)
    try:
        with environment("PUBSUB_EMULATOR_HOST", emulator.host):
            admin = Admin(emulator)
            topic = admin.topic_path(unique("bench"))
            await asyncio.to_thread(admin.create, topic, admin.subscription_path(unique("b")))
            try:
                return await drain("Pub/Sub emulator", {"type": "pubsub", "topic": topic}, total)
            finally:
                admin.close()
    finally:
        await asyncio.to_thread(emulator.stop)


async def kafka(total: int) -> Drain | str:
    """Drain to librdkafka's mock cluster (3 brokers, in this process); a reason if unavailable.

    The brokers share this process and its 2 cores with the bridge, so the figure is a floor
    for the sink's own cost, not a claim about a real cluster's throughput.
    """
    from tests.sinks.kafka_mock import MockCluster, library

    lib = library()
    if lib is None:
        return "skipped: confluent-kafka (the [kafka] extra) is not installed"
    cluster = MockCluster(lib)
    cluster.start()
    try:
        topic = cluster.create_topic(partitions=4)
        sink = {"type": "kafka", "bootstrap_servers": cluster.bootstrap.split(","), "topic": topic}
        return await drain("Kafka mock cluster, binary", sink, total)
    finally:
        cluster.stop()


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
