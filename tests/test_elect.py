"""`maintenance-bridge elect`: leadership on a real etcd election, driven by the real bridges'
`/v1/eligible`, handed away from a VM that gets a notice and never back while it blocks.

Three VMs of one simulated Azure group, each with its bridge (and its listener serving the
status API) and its `elect` wrapper run as a process around a command that logs when it
leads and when it is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from bridge.config import Listener
from bridge.providers.azure.simulated.group import AzureGroup
from bridge.runner import ProviderName
from bridge.simulator import Simulator
from bridge.surface.health import HealthMonitor
from bridge.surface.routes import serving
from tests.etcd_server import EtcdServer
from tests.etcd_server import etcd as etcd
from tests.support import CheckedSink, eventually, running_bridge

AZURE: tuple[ProviderName, ...] = ("azure",)
ELECTION = "/maintenance-bridge/election/scheduler/"
WORKLOAD = """
import os, signal, sys, time
name, log = os.environ["NAME"], open(os.environ["LOG"], "a")
def stop(*_):
    log.write(name + " stop\\n"); log.flush(); sys.exit(0)
signal.signal(signal.SIGTERM, stop)
log.write(name + " lead\\n"); log.flush()
while True:
    time.sleep(1)
"""


@contextlib.asynccontextmanager
async def vm(
    sim: Simulator, group: AzureGroup, etcd: EtcdServer, name: str, tmp_path: Path, log: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    """VM `name`: its bridge, its listener and its `elect` wrapper (yielded)."""
    async with running_bridge(
        sim,
        tmp_path / name,
        AZURE,
        sink=CheckedSink(name),
        azure={"imds_url": group.imds_url(name)},
    ) as run:
        monitor = HealthMonitor()
        monitor.attach(run.bridge)
        async with serving(Listener(port=0), monitor) as listener:
            assert listener is not None
            elector = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bridge",
                "elect",
                "--endpoint",
                etcd.url,
                "--eligible-url",
                f"{listener.url}/v1/eligible",
                "--value",
                name,
                "--ttl",
                "4",
                "--interval",
                "0.2",
                "--grace",
                "5",
                "scheduler",
                "--",
                sys.executable,
                "-c",
                WORKLOAD,
                env={**os.environ, "NAME": name, "LOG": str(log)},
                start_new_session=True,
            )
            try:
                yield elector
            finally:
                with contextlib.suppress(ProcessLookupError):
                    elector.send_signal(signal.SIGTERM)
                await asyncio.wait_for(elector.wait(), 30)


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def leads(log: Path) -> list[str]:
    return [line.split()[0] for line in lines(log) if line.endswith(" lead")]


async def test_leadership_moves_away_from_a_vm_with_a_notice_and_never_back_while_it_blocks(
    azure_sim: Simulator, etcd: EtcdServer, tmp_path: Path
) -> None:
    log = tmp_path / "leaders.log"
    names = ["vm-0", "vm-1", "vm-2"]
    async with AzureGroup(azure_sim, names) as group, contextlib.AsyncExitStack() as stack:
        electors = {
            name: await stack.enter_async_context(vm(azure_sim, group, etcd, name, tmp_path, log))
            for name in names
        }
        await eventually(lambda: len(leads(log)) == 1, timeout=30)
        (first,) = leads(log)
        await eventually(lambda: len(etcd.keys(ELECTION)) == 3)  # everyone is a candidate

        notice = azure_sim.azure.add_event(event_type="Freeze", resources=[first])
        await eventually(lambda: len(leads(log)) == 2, timeout=30)
        second = leads(log)[1]
        assert second != first
        # The VM with the notice withdrew and does not campaign while it blocks.
        await eventually(lambda: first not in etcd.keys(ELECTION).values())

        azure_sim.azure.add_event(event_type="Freeze", resources=[second])
        await eventually(lambda: len(leads(log)) == 3, timeout=30)
        third = leads(log)[2]
        assert third not in (first, second)

        azure_sim.azure.remove_event(notice)  # first's maintenance is over: eligible again
        await eventually(lambda: first in etcd.keys(ELECTION).values(), timeout=30)
        assert leads(log) == [first, second, third]  # a candidate again, not the leader
        for name in (first, second, third):  # the leader last, or the next would lead
            elector = electors[name]
            elector.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(elector.wait(), 30) == 0, name
    assert lines(log) == [
        f"{first} lead",
        f"{first} stop",
        f"{second} lead",
        f"{second} stop",
        f"{third} lead",
        f"{third} stop",
    ]
    assert etcd.keys(ELECTION) == {}  # every candidacy withdrawn on exit


async def test_an_etcd_restart_keeps_the_leader_and_the_hand_over_still_works(
    azure_sim: Simulator, etcd: EtcdServer, tmp_path: Path
) -> None:
    log = tmp_path / "leaders.log"
    names = ["vm-0", "vm-1"]
    async with AzureGroup(azure_sim, names) as group, contextlib.AsyncExitStack() as stack:
        electors = {
            name: await stack.enter_async_context(vm(azure_sim, group, etcd, name, tmp_path, log))
            for name in names
        }
        await eventually(lambda: len(etcd.keys(ELECTION)) == 2, timeout=30)
        await eventually(lambda: len(leads(log)) == 1, timeout=30)
        (leader,) = leads(log)
        (other,) = set(names) - {leader}
        etcd.stop()  # the leader's lease survives in etcd's data; a candidate campaigns anew
        etcd.start()
        await eventually(lambda: len(etcd.keys(ELECTION)) == 2, timeout=30)
        assert leads(log) == [leader]
        azure_sim.azure.add_event(event_type="Freeze", resources=[leader])
        await eventually(lambda: len(leads(log)) == 2, timeout=30)
        for name in (leader, other):
            electors[name].send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(electors[name].wait(), 30) == 0
    assert lines(log) == [f"{leader} lead", f"{leader} stop", f"{other} lead", f"{other} stop"]
