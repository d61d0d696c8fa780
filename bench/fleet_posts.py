"""`python -m bench.fleet_posts [--seconds S] [--senders N] [--store sqlite|postgres]`: signed
one-event posts, as each sidecar sends them, into the fleet service against a do-nothing
aiohttp server.

Every VM posts its own events one per request, many at once. This runs, one after the other
and from the same client (this process, aiohttp, `--senders` concurrent connections):

- **floor**: `bench.fleet_floor`, an aiohttp server in its own process that reads each body
  and answers what the fleet answers - the most any aiohttp service can take from this
  client on this machine;
- **fleet, one transaction per post**: `maintenance-bridge fleet` (its own process, a
  SQLite store or, with `--store postgres`, a database of a throwaway PostgreSQL cluster
  from the machine's binaries, a Standard Webhooks secret) with `[fleet.ingest]
  group_events = 1`, which is what the service did before group commit (left out with
  `--grouped-only`);
- **fleet, group commit**: the same with the defaults (`bridge.fleet.group_commit`).

All run at once and take turns, `--rounds` times (the machine's load drifts between runs;
side by side in time the ratios hold).

Each post is a distinct signed event (structured mode) answered only after its durable
commit: a heartbeat of one VM of a fleet of 10,000 (`--kind heartbeat`, the default, what
`bench.fleet_scale`'s figure posts) or a new maintenance notice (`--kind transition`).
Prints requests per second and each fleet figure as a share of the floor (the median of the
rounds' ratios), and each server's CPU time per request (user and system, all its threads,
from psutil): wall rates swing with what else runs on the host,
the CPU a request costs the server much less. For the fleet servers it splits that CPU into
the event loop's thread (aiohttp, the source's checks, the answers) and the other threads
(the store's writer, mostly), adds PostgreSQL's own CPU per request, and prints the posts
each store transaction held in each round (`/metrics`: the size of the groups).
`--profile DIR` records the group-commit server with py-spy (`--idle`, one raw file of
stacks per thread per round) for a look at where the loop's and the writer's time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from bench.fleet import SECRET, _transition, _vm
from bench.fleet_replicas import postgres_cpu
from bench.fleet_workload import heartbeat, vm
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


def _fleet_config(workdir: Path, port: int, store: str, ingest: dict[str, Any]) -> Path:
    config = workdir / "fleet.toml"
    extra = "".join(f"{key} = {value!r}\n" for key, value in ingest.items())
    config.write_text(
        f'[fleet.listener]\nport = {port}\n[fleet.store]\nurl = "{store}"\n'
        f"[fleet.ingest]\n{extra}"
        f'[[fleet.sources]]\ntype = "http"\nsecrets = ["{SECRET}"]\n'
    )
    return config


#: VMs the heartbeats come from, round the fleet (each post most likely another VM's, as
#: when many sidecars post at once; `bench.fleet_scale` does the same at 100,000).
INSTANCES = 10_000


def prepared(
    label: str, senders: int, per_sender: int, kind: str = "heartbeat", round_: int = 0
) -> list[list[tuple[bytes, dict[str, str]]]]:
    """Each sender's signed posts, made before the clock starts (the client's own work is
    not what is measured): heartbeats round a fleet of `INSTANCES` VMs (sender `n` posts
    VM n, n + senders, ...), new ones each round; or, with `kind` "transition", a new
    maintenance notice of the sender's VM per post (each post a new notice row)."""
    key = signing.standard_key(SECRET)
    now = int(time.time())
    at = datetime.now(UTC)
    shares = []
    for number in range(senders):
        share = []
        for sequence in range(per_sender):
            if kind == "heartbeat":
                index = (number + senders * sequence) % INSTANCES
                body = heartbeat(vm(index), 1_000_000 * (round_ + 1) + sequence, at)
            else:
                body = _transition(_vm(number), f"{label}-{sequence}", Status.SCHEDULED, T0, T0)
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


@dataclass
class Round:
    """One server's round: requests per second, and CPU microseconds per request."""

    rate: float
    cpu: float  # the server process, all its threads
    loop: float = 0.0  # the fleet's event-loop thread (its main thread)
    other: float = 0.0  # the fleet's other threads (the store's writer, mostly)
    postgres: float = 0.0  # PostgreSQL's processes, with `--store postgres`


def _threads(pid: int) -> tuple[float, float]:
    """CPU seconds of a process's main thread (the fleet's event loop) and of the rest."""
    loop = other = 0.0
    for thread in psutil.Process(pid).threads():
        spent = thread.user_time + thread.system_time
        if thread.id == pid:
            loop += spent
        else:
            other += spent
    return loop, other


@contextlib.asynccontextmanager
async def _store(kind: str, workdir: Path) -> AsyncIterator[tuple[Callable[[], str], int | None]]:
    """Where each fleet server keeps its events: a new SQLite file or PostgreSQL database per
    call, and the postmaster's pid (None for SQLite)."""
    if kind == "sqlite":
        counter = iter(range(1_000))
        yield (lambda: f"sqlite://{workdir}/fleet-{next(counter)}.db"), None
        return
    from bench.fleet_replicas import postgres

    async with postgres() as (url, postmaster):
        from tests.fleet.postgres_server import USER

        base = url.rsplit("/", 1)[0]
        names = iter(range(1_000))

        def database() -> str:
            import psycopg

            name = f"posts_{next(names)}"
            with psycopg.connect(f"{base}/postgres", autocommit=True) as connection:
                connection.execute(f'CREATE DATABASE "{name}" OWNER "{USER}"')
            return f"{base}/{name}"

        yield database, postmaster


def _profiler(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    """py-spy recording `pid` for `seconds` (raw stacks per thread, idle ones too)."""
    spy = shutil.which("py-spy")
    if spy is None:
        print("py-spy is not installed: no profile", file=sys.stderr)
        return None
    command = [spy, "record", "--idle", "--threads", "-r", "100", "-f", "raw"]
    command += ["-d", str(max(1, int(seconds))), "-p", str(pid), "-o", str(out)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def run(
    seconds: float,
    senders: int,
    rounds: int,
    *,
    store: str = "sqlite",
    kind: str = "heartbeat",
    grouped_only: bool = False,
    profile: Path | None = None,
) -> list[tuple[str, list[Round]]]:
    """Requests per second and CPU microseconds per request of each server, `rounds` times,
    the servers taking turns (the machine's load drifts: side by side in time, the ratios
    hold where single runs don't)."""
    arms: list[tuple[str, dict[str, Any]]] = [("group commit", {})]
    if not grouped_only:
        arms.insert(0, ("one transaction per post", {"group_events": 1, "group_wait": 0.0}))
    with tempfile.TemporaryDirectory(prefix="bench-fleet-posts-") as tmp:
        servers: list[tuple[str, int, asyncio.subprocess.Process]] = []
        async with _store(store, Path(tmp)) as (database, postmaster):
            try:
                port = free_port()
                floor = await _start(["-m", "bench.fleet_floor", str(port)], port)
                servers.append(("floor", port, floor))
                for label, ingest in arms:
                    workdir = Path(tmp) / label.replace(" ", "-")
                    workdir.mkdir()
                    port = free_port()
                    url = await asyncio.to_thread(database)
                    config = _fleet_config(workdir, port, url, ingest)
                    args = ["-m", "bridge", "fleet", "--config", str(config)]
                    servers.append((label, port, await _start(args, port)))
                per_sender = int(seconds * 20_000 / senders) + 1
                figures: dict[str, list[Round]] = {label: [] for label, _, _ in servers}
                sizes: dict[str, list[float]] = {label: [] for label, _, _ in servers}
                for round_ in range(rounds):
                    for label, port, proc in servers:
                        tag = f"{label[:1]}{round_}"
                        shares = prepared(tag, senders, per_sender, kind, round_)
                        url = f"http://127.0.0.1:{port}"
                        fleet = label != "floor"
                        spy = None
                        if profile is not None and label == "group commit":
                            out = profile / f"{store}-round{round_}.raw"
                            spy = _profiler(proc.pid, seconds, out)
                        server = psutil.Process(proc.pid)
                        cpu = sum(server.cpu_times()[:2])
                        loop, other = _threads(proc.pid) if fleet else (0.0, 0.0)
                        pg = postgres_cpu(postmaster) if fleet and postmaster else 0.0
                        grouped = await _grouped(url) if fleet else (0.0, 0.0)
                        rate, done = await _post_for(url, seconds, shares, tag)
                        cpu = sum(server.cpu_times()[:2]) - cpu
                        per = 1e6 / max(1, done)
                        figure = Round(rate, cpu * per)
                        if fleet:
                            after = _threads(proc.pid)
                            figure.loop = (after[0] - loop) * per
                            figure.other = (after[1] - other) * per
                            if postmaster:
                                figure.postgres = (postgres_cpu(postmaster) - pg) * per
                            transactions, batches = await _grouped(url)
                            transactions -= grouped[0]
                            sizes[label].append((batches - grouped[1]) / max(1.0, transactions))
                        if spy is not None:
                            await asyncio.to_thread(spy.wait)
                        figures[label].append(figure)
            finally:
                for _label, _port, proc in servers:
                    await _stop(proc)
    for label, size in sizes.items():
        if size:
            print(f"{label}: posts per transaction {', '.join(f'{s:.1f}' for s in size)}")
    return list(figures.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_posts", description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="per server and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--senders", type=int, default=64)
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument(
        "--kind",
        choices=("heartbeat", "transition"),
        default="heartbeat",
        help="what each post holds (heartbeats: the issue's figure, as bench.fleet_scale)",
    )
    parser.add_argument(
        "--grouped-only", action="store_true", help="leave out one transaction per post"
    )
    parser.add_argument(
        "--profile", type=Path, help="py-spy the group-commit server into this directory"
    )
    args = parser.parse_args(argv)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    figures = asyncio.run(
        run(
            args.seconds,
            args.senders,
            args.rounds,
            store=args.store,
            kind=args.kind,
            grouped_only=args.grouped_only,
            profile=args.profile,
        )
    )
    floor = [r.rate for r in figures[0][1]]
    print(
        f"{args.senders} senders, signed one-event posts ({args.kind}s) into {args.store}, "
        f"{args.rounds} rounds of {args.seconds:g} s per server (medians, and each round; "
        "the share of the floor is the median of the rounds' ratios; CPU per request: the "
        "server's, and for the fleet its event loop's thread + its other threads, and "
        "PostgreSQL's)"
    )
    for label, rounds in figures:
        rates = [r.rate for r in rounds]
        middle = statistics.median(rates)
        share = statistics.median(rate / base for rate, base in zip(rates, floor, strict=True))
        cpu = statistics.median(r.cpu for r in rounds)
        split = ""
        if label != "floor":
            loop = statistics.median(r.loop for r in rounds)
            other = statistics.median(r.other for r in rounds)
            split = f" (loop {loop:.0f} + other threads {other:.0f})"
            if args.store == "postgres":
                split += f", PostgreSQL {statistics.median(r.postgres for r in rounds):.0f}"
        each = ", ".join(f"{rate:.0f}" for rate in rates)
        print(
            f"{label:>26}: {middle:7.0f} requests/s ({share:.2f} of the floor), "
            f"{cpu:5.0f} us CPU per request{split} [{each}]"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
