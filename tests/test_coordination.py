# mypy: allow-untyped-calls
"""The maintenance budget against a real etcd server (Debian's etcd-server, tests/etcd_server).

Several real bridges share one simulated Azure group (AzureGroup) and one etcd; every claim
about "at most N at once" is checked from etcd's own history, not from the bridges' logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from bridge.audit import HOOK_COMPLETED
from bridge.coordination.budget import Budget, group_of
from bridge.coordination.settings import Coordination
from bridge.runner import ProviderName
from bridge.simulator import Simulator
from bridge.simulator.group import AzureGroup
from bridge.validation import validate
from tests.etcd_server import EtcdServer
from tests.etcd_server import etcd as etcd
from tests.support import CheckedSink, Running, eventually, running_bridge

AZURE: tuple[ProviderName, ...] = ("azure",)
PREFIX = "/mb-test/"
SLOTS = f"{PREFIX}budget/fleet/"
TTL = 4


def coordination(server: EtcdServer, **overrides: Any) -> dict[str, Any]:
    return {
        "endpoints": [server.url],
        "group": "fleet",
        "budget": 1,
        "lease_ttl": TTL,
        "poll_interval": 0.1,
        "request_timeout": 1.0,
        "prefix": PREFIX,
        **overrides,
    }


def drain_hook(log: Path, seconds: float = 0.3, **overrides: Any) -> dict[str, Any]:
    """A budgeted hook that notes when it ran on which VM (MB_INSTANCE) in `log`."""
    code = (
        "import os, time; f = open(os.environ['LOG'], 'a'); "
        "f.write(os.environ['MB_INSTANCE'] + ' start\\n'); f.flush(); "
        f"time.sleep({seconds}); f.write(os.environ['MB_INSTANCE'] + ' end\\n')"
    )
    return {
        "name": "drain",
        "command": ["/usr/bin/env", f"LOG={log}", sys.executable, "-c", code],
        "statuses": ["scheduled"],
        "budget": True,
        "timeout": 60,
        **overrides,
    }


@contextlib.asynccontextmanager
async def fleet(
    sim: Simulator, tmp_path: Path, names: list[str], settings: dict[str, Any]
) -> AsyncIterator[tuple[AzureGroup, dict[str, Running]]]:
    async with AzureGroup(sim, names) as group, contextlib.AsyncExitStack() as stack:
        runs: dict[str, Running] = {}
        for name in names:
            runs[name] = await stack.enter_async_context(
                running_bridge(
                    sim,
                    tmp_path / name,
                    AZURE,
                    sink=CheckedSink(name),
                    settings=settings,
                    azure={"imds_url": group.imds_url(name)},
                )
            )
        for run in runs.values():  # every bridge knows its identity and polls
            await eventually(watching(run))
        yield group, runs


def watching(run: Running) -> Callable[[], bool]:
    return lambda: run.bridge.watchers.get("azure") is not None


def budget_of(run: Running) -> Budget:
    budget = run.bridge.actions.budget
    assert budget is not None
    return budget


def max_holders(server: EtcdServer) -> tuple[int, list[str]]:
    """The most slots held at once over etcd's whole history, and who held one, in order."""
    most, holders = 0, list[str]()
    for keys in server.history(SLOTS):
        most = max(most, len(keys))
        for member in keys.values():
            if not holders or holders[-1] != member:
                holders.append(member)
    return most, holders


async def test_five_vms_with_budget_one_never_hold_two_slots_at_once(
    azure_sim: Simulator, etcd: EtcdServer, tmp_path: Path
) -> None:
    names = [f"vm-{i}" for i in range(5)]
    log = tmp_path / "drains.log"
    settings = {"coordination": coordination(etcd), "hooks": [drain_hook(log)]}
    async with fleet(azure_sim, tmp_path, names, settings) as (_group, runs):
        # Overlapping notices: one per VM, all at once, plus a second one for vm-0 while
        # its first is in force (it must not take a second slot).
        events = {
            name: azure_sim.azure.add_event(event_type="Reboot", resources=[name]) for name in names
        }
        extra = azure_sim.azure.add_event(event_type="Freeze", resources=["vm-0"])
        done: set[str] = set()
        while len(done) < len(names):
            # The "maintenance" of a VM whose drain finished: it starts, then completes,
            # which frees the slot for the next VM.
            for name, run in runs.items():
                drained = len(run.sink.of_type(HOOK_COMPLETED))
                if name not in done and drained == (2 if name == "vm-0" else 1):
                    azure_sim.azure.remove_event(events[name])
                    if name == "vm-0":
                        azure_sim.azure.remove_event(extra)
                    done.add(name)
            await asyncio.sleep(0.05)
        await eventually(lambda: etcd.keys(SLOTS) == {})
    most, holders = max_holders(etcd)
    assert most == 1
    assert sorted(holders) == names  # each VM held the one slot once, in turn
    drains = log.read_text().split("\n")[:-1]
    assert len(drains) == 12  # 6 runs: vm-0 twice, on the slot it already held
    for start, end in zip(drains[::2], drains[1::2], strict=True):
        assert start.split()[0] == end.split()[0]  # never two drains at once
    for name, run in runs.items():
        budgets = [e["data"]["budget"] for e in run.sink.of_type(HOOK_COMPLETED)]
        assert {b["outcome"] for b in budgets} == {"acquired"}
        assert {b["member"] for b in budgets} == {name}
        assert {b["group"] for b in budgets} == {"fleet"}
    waited = sum(budget_of(run).waits["hook drain"] for run in runs.values())
    assert waited >= 3  # at least the last three had to wait for a slot


def test_the_group_comes_from_the_vm_identity() -> None:
    settings = validate(Coordination, {"endpoints": ["http://etcd:2379"]})
    instance = {
        "name": "vm-1",
        "subscription": "sub",
        "resource_group": "rg",
        "scale_set": "web",
        "zone": "2",
        "location": "westeurope",
    }
    assert group_of(settings, instance) == "scale-set:sub/rg/web"
    zone = validate(Coordination, {"endpoints": ["http://etcd:2379"], "group": "zone"})
    assert group_of(zone, instance) == "zone:2"
    assert group_of(zone, {**instance, "zone": None}) == "zone:westeurope"
    literal = validate(Coordination, {"endpoints": ["http://etcd:2379"], "group": "db"})
    assert group_of(literal, instance) == "db"
