"""Benchmark: the spool's added latency per event, and the backlog drain rate to a webhook.

Not a test: it measures and prints a markdown table. The webhook receiver runs in its own
process (aiohttp on loopback) so that it does not share the bridge's event loop or core.

    .venv/bin/python -m bench.spool_drain [--events 10000]     (from the repository root)
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bridge.config import parse_config
from bridge.dispatch import Dispatcher
from bridge.events import serialize
from bridge.runner import build_sinks
from bridge.spool import NewEvent, Spool
from tests.factories import sample_events

RECEIVER = """
import sys
from aiohttp import web
count = 0
async def hook(request):
    global count
    await request.read()
    count += 1
    return web.Response(status=204)
app = web.Application()
app.router.add_post("/hook", hook)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def commit_latency(directory: Path, count: int) -> list[float]:
    """Milliseconds per single-event durable commit (what a notice pays before any send)."""
    spool = Spool(directory, ["webhook"])
    await spool.open()
    events = sample_events(count)
    timings: list[float] = []
    for event in events:
        row = NewEvent(event.get_id(), event.get_source(), event.get_type(), serialize(event))
        started = time.perf_counter()
        await spool.commit([row], {"bench": {"n": len(timings)}})
        timings.append((time.perf_counter() - started) * 1000)
    await spool.close()
    return timings


async def drain(directory: Path, url: str, total: int) -> float:
    """Events per second delivered from a spool holding `total` events."""
    config = parse_config({"sinks": [{"type": "webhook", "url": url}]})
    sinks = build_sinks(config)
    spool = Spool(directory, [s.name for s in sinks])
    await spool.open()
    events = sample_events(total)
    rows = [NewEvent(e.get_id(), e.get_source(), e.get_type(), serialize(e)) for e in events]
    for start in range(0, total, 500):
        await spool.commit(rows[start : start + 500])
    dispatcher = Dispatcher(spool, sinks)
    started = time.perf_counter()
    dispatcher.start()
    dispatcher.notify()
    while dispatcher.stats["webhook"].delivered < total:  # noqa: ASYNC110 - a progress poll
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - started
    await dispatcher.stop(5.0)
    await spool.close()
    return total / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--latency-samples", type=int, default=300)
    args = parser.parse_args()
    port = free_port()
    receiver = await asyncio.create_subprocess_exec(sys.executable, "-c", RECEIVER, str(port))
    try:
        await asyncio.sleep(1.0)
        with tempfile.TemporaryDirectory() as one, tempfile.TemporaryDirectory() as two:
            latency = await commit_latency(Path(one), args.latency_samples)
            rate = await drain(Path(two), f"http://127.0.0.1:{port}/hook", args.events)
    finally:
        receiver.terminate()
        await receiver.wait()
    quantiles = statistics.quantiles(latency, n=100)
    print(
        f"machine: {platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.system()}"
    )
    print()
    print("| measure | value |")
    print("| --- | --- |")
    print(f"| spool commit per notice (durable, fsync), p50 | {quantiles[49]:.2f} ms |")
    print(f"| spool commit per notice, p99 | {quantiles[98]:.2f} ms |")
    print(f"| backlog drain, {args.events} events to a local webhook | {rate:,.0f} events/s |")


if __name__ == "__main__":
    asyncio.run(main())
