"""End to end through a bus: five real `maintenance-bridge run` processes watch simulated VMs
(three GCE, two Azure) and publish to the Pub/Sub emulator, the Event Hubs test server or
librdkafka's mock cluster; a fleet service in its own process consumes the bus. The fleet
service is killed with SIGKILL while the second transition of every VM streams in, and
started again.

At the end the fleet's audit log holds every transition the simulators played exactly once,
and each notice's transitions are the ones played, in order. The same runs with two fleet
replicas sharing a real PostgreSQL server (one of them killed): they answer alike, each
consuming its share (Event Hubs: the partitions split through the store,
`share_partitions`; Pub/Sub: the subscription splits the messages; Kafka: the consumer
group splits the partitions). Nothing is mocked: real processes, real client libraries,
real servers (skipped without them, failing under CI=true).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from bridge.fleet.service import build_store
from bridge.fleet.store import NoticeFilter
from bridge.simulator import Simulator
from tests.fleet.buses import Bus, toml_table
from tests.support import eventually, free_port

pytest_plugins = ["tests.fleet.bus_fixture", "tests.fleet.postgres_server"]

ROOT = Path(__file__).resolve().parents[2]
GCE_VMS = ("web-1", "web-2", "web-3")
AZURE_VMS = ("db-1", "db-2")
AZURE_EVENT = "22222222-0000-4000-8000-00000000000{}"
TIMEOUT = 90.0


class Process:
    """A `python -m ...` child with its output in a log file; killable and restartable."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.args = args
        self.log = log
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", *self.args, cwd=ROOT, stdout=out, stderr=out
            )

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()  # SIGKILL
        await self.proc.wait()

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 20)
            except TimeoutError:
                await self.kill()


def sidecar_config(sim: Simulator, provider: str, state: Path, bus: Bus) -> str:
    return (
        toml_table("[source]", {"provider": provider})
        + toml_table(
            "[source.gce]",
            {"metadata_url": sim.gce_url, "long_poll_timeout": 5, "upcoming_poll_interval": 0.5},
        )
        + toml_table("[source.azure]", {"imds_url": sim.azure_url, "poll_interval": 0.2})
        + toml_table("[state]", {"dir": str(state)})
        + toml_table("[listener]", {"port": 0})
        + toml_table("[delivery]", {"retry_initial": 0.05, "retry_max": 0.5})
        + toml_table("[heartbeat]", {"interval": 0})
        + toml_table("[[sinks]]", bus.sink)
    )


@dataclass
class Fleet:
    process: Process
    url: str

    async def answers(self) -> dict[str, Any]:
        """The audit log, the summary and the instances, as this replica serves them."""
        async with httpx.AsyncClient(timeout=10) as client:
            summary = (await client.get(f"{self.url}/v1/fleet/summary")).json()
            instances = (await client.get(f"{self.url}/v1/fleet/instances")).json()
        return {"events": await self.events(), "summary": summary, "instances": instances}

    async def events(self) -> list[dict[str, Any]]:
        """The whole audit log, through the API (every page)."""
        found: list[dict[str, Any]] = []
        cursor = 0
        async with httpx.AsyncClient(timeout=10) as client:
            while True:
                response = await client.get(f"{self.url}/v1/fleet/events?cursor={cursor}")
                response.raise_for_status()
                found.extend(response.json())
                following = response.headers.get("Fleet-Next-Cursor")
                if following is None:
                    return found
                cursor = int(following)

    async def count(self) -> int:
        try:
            return len(await self.events())
        except httpx.HTTPError:
            return -1  # restarting

    async def reached(self, count: int) -> None:
        async def enough() -> bool:
            return await self.count() >= count

        await eventually(enough, timeout=TIMEOUT)


@pytest.fixture
async def simulators() -> AsyncIterator[dict[str, Simulator]]:
    sims: dict[str, Simulator] = {}
    async with contextlib.AsyncExitStack() as stack:
        for name in GCE_VMS:
            sim = Simulator(provider="gce", identity={"gce": {"instance_name": name}})
            sims[name] = await stack.enter_async_context(sim)
        for index, name in enumerate(AZURE_VMS):
            identity = {
                "azure": {"name": name, "vm_id": f"0000000{index}-74ef-476e-8182-f6d2ba4166a6"}
            }
            sim = Simulator(provider="azure", identity=identity)
            sims[name] = await stack.enter_async_context(sim)
        for name, sim in sims.items():
            sim.faults.set(provider="gce" if name in GCE_VMS else "azure", rate_limit=False)
        yield sims


def steps(sims: dict[str, Simulator]) -> list[list[Callable[[], object]]]:
    """Three rounds; GCE VMs take part in the first two (started, completed), Azure VMs in
    all three (scheduled, started, completed)."""
    key = "instance/maintenance-event"
    rounds: list[list[Callable[[], object]]] = [[], [], []]
    for name in GCE_VMS:
        gce = sims[name].gce
        rounds[0].append(functools.partial(gce.set, key, "MIGRATE_ON_HOST_MAINTENANCE"))
        rounds[1].append(functools.partial(gce.set, key, "NONE"))
    for index, name in enumerate(AZURE_VMS):
        azure, event = sims[name].azure, AZURE_EVENT.format(index)
        rounds[0].append(
            functools.partial(
                azure.add_event, event_id=event, event_type="Reboot", auto_complete=False
            )
        )
        rounds[1].append(functools.partial(azure.start_event, event))
        rounds[2].append(functools.partial(azure.remove_event, event))
    return rounds


EXPECTED = {name: ["started", "completed"] for name in GCE_VMS} | {
    name: ["scheduled", "started", "completed"] for name in AZURE_VMS
}


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, int]:
    """The fleet store's URL and how many fleet replicas share it: one on SQLite, two on a
    real PostgreSQL server (tests/fleet/postgres_server.py)."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'fleet.sqlite3'}", 1
    return str(request.getfixturevalue("postgres_url")), 2


@pytest.mark.slow
async def test_five_sidecars_through_the_bus_into_the_fleet_despite_a_kill_9(
    bus: Bus, shared_store: tuple[str, int], tmp_path: Path, simulators: dict[str, Simulator]
) -> None:
    url, replicas = shared_store
    source = dict(bus.source)
    if replicas > 1 and source["type"] == "eventhubs":
        # Replicas split the partitions through the store; the killed one's partitions go
        # to the other after six intervals without renewal.
        source |= {"share_partitions": True, "load_balancing_interval": 0.5}
    fleets = []
    for replica in range(replicas):
        port = free_port()
        fleet_toml = tmp_path / f"fleet-{replica}.toml"
        fleet_toml.write_text(
            toml_table("[fleet.listener]", {"port": port})
            + toml_table("[fleet.store]", {"url": url})
            + toml_table("[[fleet.sources]]", source)
        )
        log = tmp_path / f"fleet-{replica}.log"
        fleets.append(
            Fleet(
                Process(["bridge", "fleet", "--config", str(fleet_toml)], log),
                f"http://127.0.0.1:{port}",
            )
        )
    fleet = fleets[0]  # the one killed; with PostgreSQL the other goes on consuming
    sidecars = []
    for name, sim in simulators.items():
        config = tmp_path / f"{name}.toml"
        provider = "gce" if name in GCE_VMS else "azure"
        config.write_text(sidecar_config(sim, provider, tmp_path / name, bus))
        sidecars.append(
            Process(
                ["bridge", "--log-format", "json", "run", "--config", str(config)],
                tmp_path / f"{name}.log",
            )
        )
    rounds = steps(simulators)
    total = sum(len(r) for r in rounds)
    try:
        await asyncio.gather(*(f.process.start() for f in fleets))
        await asyncio.gather(*(sidecar.start() for sidecar in sidecars))
        for play in rounds[0]:
            play()
        await fleet.reached(len(rounds[0]))
        for play in rounds[1]:
            play()
        await fleet.reached(len(rounds[0]) + 1)  # the second round is streaming in
        assert fleet.process.proc is not None
        helpers = psutil.Process(fleet.process.proc.pid).children()  # Event Hubs' receiver
        await fleet.process.kill()
        _, left = await asyncio.to_thread(psutil.wait_procs, helpers, 30)
        assert not left  # a killed fleet's receiver process goes with it
        await fleet.process.start()
        await fleet.reached(len(rounds[0]) + len(rounds[1]))
        for play in rounds[2]:
            play()
        await fleet.reached(total)
        answers = [await f.answers() for f in fleets]
    finally:
        await asyncio.gather(*(sidecar.stop() for sidecar in sidecars))
        await asyncio.gather(*(f.process.stop() for f in fleets))

    assert all(answer == answers[0] for answer in answers)  # replicas agree
    logged = answers[0]["events"]
    assert len(logged) == total
    assert len({(e["source"], e["id"]) for e in logged}) == total  # each exactly once
    store = build_store(url)
    await store.open()
    try:
        notices = await store.notices(NoticeFilter(), in_force=False)
    finally:
        await store.close()
    played = {n["instance"]: [t["status"] for t in n["transitions"]] for n in notices}
    assert played == EXPECTED
    assert all(n["status"] == "completed" for n in notices)
