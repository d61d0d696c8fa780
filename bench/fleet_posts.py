"""`python -m bench.fleet_posts [--seconds S] [--senders N]`: signed one-event posts, as each
sidecar sends them, into the fleet service against a do-nothing aiohttp server.

Every VM posts its own events one per request, many at once. This runs, one after the other
and from the same client (this process, aiohttp, `--senders` concurrent connections):

- **floor**: `bench.fleet_floor`, an aiohttp server in its own process that reads each body
  and answers what the fleet answers - the most any aiohttp service can take from this
  client on this machine;
- **fleet, one transaction per post**: `maintenance-bridge fleet` (its own process, SQLite
  store, a Standard Webhooks secret) with `[fleet.ingest] group_events = 1`, which is what
  the service did before group commit;
- **fleet, group commit**: the same with the defaults (`bridge.fleet.group_commit`).

All three run at once and take turns, `--rounds` times (the machine's load drifts between
runs; side by side in time the ratios hold).

Each post is a distinct signed maintenance event (structured mode) answered only after its
durable commit. Prints requests per second and each fleet figure as a share of the floor
(the median of the rounds' ratios), and each server's CPU time per request (user and
system, all its threads, from psutil): wall rates swing with what else runs on the host,
the CPU a request costs the server much less. For the fleet servers it also prints the posts
each store transaction held in each round (`/metrics`: the size of the groups).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from bench.fleet import SECRET, _transition, _vm
from bridge.pipeline.model import Status
from bridge.transports import webhook_signing as signing
from tests.fleet.factories import T0
from tests.support import free_port


async def _ready(url: str, proc: asyncio.subprocess.Process) -> None:
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise RuntimeError(f"{url}: the server exited ({proc.returncode})")
            try:
                async with http.get(f"{url}/readyz") as answer:
                    if answer.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not become ready")


async def _start(args: list[str], port: int) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.DEVNULL
    )
    await _ready(f"http://127.0.0.1:{port}", proc)
    return proc


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        await proc.wait()


def _fleet_config(workdir: Path, port: int, ingest: dict[str, Any]) -> Path:
    config = workdir / "fleet.toml"
    extra = "".join(f"{key} = {value!r}\n" for key, value in ingest.items())
    config.write_text(
        f'[fleet.listener]\nport = {port}\n[fleet.store]\nurl = "sqlite://{workdir}/fleet.db"\n'
        f"[fleet.ingest]\n{extra}"
        f'[[fleet.sources]]\ntype = "http"\nsecrets = ["{SECRET}"]\n'
    )
    return config


def prepared(label: str, senders: int, per_sender: int) -> list[list[tuple[bytes, dict[str, str]]]]:
    """Each sender's signed posts, made before the clock starts (the client's own work is
    not what is measured): distinct events of the sender's VM."""
    key = signing.standard_key(SECRET)
    now = int(time.time())
    shares = []
    for number in range(senders):
        vm = _vm(number)
        share = []
        for sequence in range(per_sender):
            body = _transition(vm, f"{label}-{sequence}", Status.SCHEDULED, T0, T0)
            headers = signing.standard_headers(f"{label}-{number}-{sequence}", now, body, [key])
            headers["content-type"] = "application/cloudevents+json"
            share.append((body, headers))
        shares.append(share)
    return shares


async def _post_for(
    url: str, seconds: float, shares: list[list[tuple[bytes, dict[str, str]]]], label: str
) -> tuple[float, int]:
    """Requests per second of concurrent signed one-event posts, one sender per share, for
    `seconds` (or until the shares are sent), and how many were answered."""
    done = 0
    stop_at = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=len(shares))

    async def sender(
        share: list[tuple[bytes, dict[str, str]]], http: aiohttp.ClientSession
    ) -> None:
        nonlocal done
        for body, headers in share:
            if time.monotonic() >= stop_at:
                return
            async with http.post(f"{url}/v1/events", data=body, headers=headers) as answer:
                await answer.read()
                if answer.status != 200:
                    raise RuntimeError(f"{label}: answered {answer.status}")
            done += 1

    async with aiohttp.ClientSession(connector=connector) as http:
        started = time.monotonic()
        await asyncio.gather(*(sender(share, http) for share in shares))
        return done / (time.monotonic() - started), done


async def _grouped(url: str) -> tuple[float, float]:
    """The server's group-commit transactions and the posts they held so far (`/metrics`)."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as answer:
        text = await answer.text()
    found = dict.fromkeys(("transactions", "batches"), 0.0)
    for line in text.splitlines():
        for key in found:
            if line.startswith(f"fleet_ingest_group_{key}_total "):
                found[key] = float(line.split()[1])
    return found["transactions"], found["batches"]


async def run(
    seconds: float, senders: int, rounds: int
) -> list[tuple[str, list[tuple[float, float]]]]:
    """Requests per second and CPU microseconds per request of each server, `rounds` times,
    the servers taking turns (the machine's load drifts: side by side in time, the ratios
    hold where single runs don't)."""
    with tempfile.TemporaryDirectory(prefix="bench-fleet-posts-") as tmp:
        servers: list[tuple[str, int, asyncio.subprocess.Process]] = []
        try:
            port = free_port()
            floor = await _start(["-m", "bench.fleet_floor", str(port)], port)
            servers.append(("floor", port, floor))
            for label, ingest in (
                ("one transaction per post", {"group_events": 1, "group_wait": 0.0}),
                ("group commit", {}),
            ):
                workdir = Path(tmp) / label.replace(" ", "-")
                workdir.mkdir()
                port = free_port()
                config = _fleet_config(workdir, port, ingest)
                args = ["-m", "bridge", "fleet", "--config", str(config)]
                servers.append((label, port, await _start(args, port)))
            per_sender = int(seconds * 20_000 / senders) + 1
            rates: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in servers}
            sizes: dict[str, list[float]] = {label: [] for label, _, _ in servers}
            for round_ in range(rounds):
                for label, port, proc in servers:
                    tag = f"{label[:1]}{round_}"
                    shares = prepared(tag, senders, per_sender)
                    url = f"http://127.0.0.1:{port}"
                    server = psutil.Process(proc.pid)
                    cpu = sum(server.cpu_times()[:2])
                    grouped = await _grouped(url) if label != "floor" else (0.0, 0.0)
                    rate, done = await _post_for(url, seconds, shares, tag)
                    cpu = sum(server.cpu_times()[:2]) - cpu
                    if label != "floor":
                        transactions, batches = await _grouped(url)
                        transactions -= grouped[0]
                        sizes[label].append((batches - grouped[1]) / max(1.0, transactions))
                    rates[label].append((rate, cpu / max(1, done) * 1e6))
        finally:
            for _label, _port, proc in servers:
                await _stop(proc)
    for label, size in sizes.items():
        if size:
            print(f"{label}: posts per transaction {', '.join(f'{s:.1f}' for s in size)}")
    return list(rates.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_posts", description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="per server and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--senders", type=int, default=64)
    args = parser.parse_args(argv)
    figures = asyncio.run(run(args.seconds, args.senders, args.rounds))
    floor = [rate for rate, _cpu in figures[0][1]]
    print(
        f"{args.senders} senders, signed one-event posts, {args.rounds} rounds of "
        f"{args.seconds:g} s per server (medians, and each round; the share of the floor is "
        "the median of the rounds' ratios)"
    )
    for label, rounds in figures:
        rates = [rate for rate, _cpu in rounds]
        middle = statistics.median(rates)
        share = statistics.median(rate / base for rate, base in zip(rates, floor, strict=True))
        cpu = statistics.median(cpu for _rate, cpu in rounds)
        each = ", ".join(f"{rate:.0f}" for rate in rates)
        print(
            f"{label:>26}: {middle:7.0f} requests/s ({share:.2f} of the floor), "
            f"{cpu:5.0f} us CPU per request [{each}]"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
