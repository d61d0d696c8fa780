# mypy: allow-untyped-calls
"""The maintenance budget against a real etcd server (Debian's etcd-server, tests/etcd_server).

Several real bridges share one simulated Azure group (AzureGroup) and one etcd; every claim
about "at most N at once" is checked from etcd's own history, not from the bridges' logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge import contract
from bridge.actions.audit import APPROVED, BUDGET_RELEASED, BUDGET_UNRENEWED, HOOK_COMPLETED
from bridge.actions.coordination.budget import Budget, build, group_of
from bridge.actions.coordination.settings import Coordination
from bridge.config import ConfigError, parse_config
from bridge.infra import platform
from bridge.infra.validation import validate
from bridge.providers.azure.simulated.group import AzureGroup
from bridge.runner import ProviderName
from bridge.simulator import Simulator
from bridge.surface import metrics
from bridge.surface.doctor import Doctor
from bridge.surface.health import HealthMonitor
from tests.etcd_server import Blackhole, EtcdServer
from tests.etcd_server import etcd as etcd
from tests.sinks.test_webhook import self_signed
from tests.support import (
    CheckedSink,
    Running,
    bridge_config,
    eventually,
    running_bridge,
    running_group,
)

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


def text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


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
    async with running_group(azure_sim, tmp_path, names, settings) as (_group, runs):
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
    # The audit trail tells the same story: one release per VM, holding times disjoint.
    held = []
    for name, run in runs.items():
        await run.sink.wait_for_type(BUDGET_RELEASED)
        (released,) = run.sink.of_type(BUDGET_RELEASED)
        budget = released["data"]["budget"]
        assert budget["member"] == name
        assert released["subject"] == events[name] or name == "vm-0"
        held.append((budget["acquired_at"], budget["released_at"]))
    held.sort()
    for (_, released_at), (acquired_at, _) in itertools.pairwise(held):
        assert released_at <= acquired_at
    waited = sum(budget_of(run).waits["hook drain"] for run in runs.values())
    assert waited >= 3  # at least the last three had to wait for a slot


def _instance(**fields: str | None) -> contract.InstanceData:
    """An event's `data.instance`: unset fields are null, as a watcher writes them."""
    unset = dict.fromkeys(("zone", "location", "project", "subscription"), None)
    base = {"id": "1", "resource_id": "r", "resource_group": None, "scale_set": None, **unset}
    return msgspec.convert({**base, **fields}, contract.InstanceData)


def test_the_group_comes_from_the_vm_identity() -> None:
    settings = validate(Coordination, {"endpoints": ["http://etcd:2379"]})
    instance = _instance(
        name="vm-1",
        subscription="sub",
        resource_group="rg",
        scale_set="web",
        zone="2",
        location="westeurope",
    )
    assert group_of(settings, instance) == "scale-set:sub/rg/web"
    zone = validate(Coordination, {"endpoints": ["http://etcd:2379"], "group": "zone"})
    assert group_of(zone, instance) == "zone:2"
    assert group_of(zone, msgspec.structs.replace(instance, zone=None)) == "zone:westeurope"
    literal = validate(Coordination, {"endpoints": ["http://etcd:2379"], "group": "db"})
    assert group_of(literal, instance) == "db"


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def config_file(path: Path, tables: dict[str, dict[str, Any]], hooks: list[dict[str, Any]]) -> Path:
    """A TOML configuration (flat tables and [[hooks]]) for a bridge run as a process."""
    lines = []
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {_toml(value)}" for key, value in table.items()]
    for hook in hooks:
        lines.append("[[hooks]]")
        lines += [f"{key} = {_toml(value)}" for key, value in hook.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


async def test_a_killed_holder_loses_its_slot_within_the_lease_ttl(
    azure_sim: Simulator, etcd: EtcdServer, tmp_path: Path
) -> None:
    log = tmp_path / "drains.log"
    pid_file = tmp_path / "hook.pid"
    hold = (
        "import os, time; open(os.environ['PIDS'], 'w').write(str(os.getpid())); "
        "open(os.environ['LOG'], 'a').write(os.environ['MB_INSTANCE'] + ' start\\n'); "
        "time.sleep(600)"
    )
    slow = {
        "name": "drain",
        "command": ["/usr/bin/env", f"LOG={log}", f"PIDS={pid_file}", sys.executable, "-c", hold],
        "statuses": ["scheduled"],
        "budget": True,
        "timeout": 600,
    }
    settings = {"coordination": coordination(etcd), "hooks": [drain_hook(log)]}
    async with AzureGroup(azure_sim, ["vm-0", "vm-1"]) as group:
        # vm-0 is a real bridge process, so that it can be killed with -9.
        config = config_file(
            tmp_path / "vm-0.toml",
            {
                "source": {"provider": "azure"},
                "source.azure": {"imds_url": group.imds_url("vm-0"), "poll_interval": 0.25},
                "state": {"dir": str(tmp_path / "vm-0")},
                "listener": {"enabled": False},
                "coordination": coordination(etcd),
            },
            [slow],
        )
        bridge = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bridge",
            "run",
            "--config",
            str(config),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            **platform.current().spawn_options(),
        )
        try:
            azure_sim.azure.add_event(event_type="Reboot", resources=["vm-0"])
            await eventually(lambda: "vm-0 start" in text(log), timeout=30)
            assert list(etcd.keys(SLOTS).values()) == ["vm-0"]
            async with running_bridge(
                azure_sim,
                tmp_path / "vm-1",
                AZURE,
                sink=CheckedSink("vm-1"),
                settings=settings,
                azure={"imds_url": group.imds_url("vm-1")},
            ) as run:
                azure_sim.azure.add_event(event_type="Reboot", resources=["vm-1"])
                await eventually(
                    lambda: budget_of(run).takes == {} and budget_of(run).unavailable == 0
                )
                await eventually(lambda: budget_of(run).last_contact is not None)
                assert "vm-1" not in text(log)  # waiting: vm-0 holds the slot
                platform.current().contain(bridge.pid).kill()  # kill -9 of the whole group
                await bridge.wait()
                loop = asyncio.get_running_loop()
                killed_at = loop.time()
                await eventually(lambda: "vm-0" not in etcd.keys(SLOTS).values(), timeout=TTL + 2)
                freed_after = loop.time() - killed_at
                (completed,) = await run.sink.wait_for_type(HOOK_COMPLETED, timeout=10)
        finally:
            with contextlib.suppress(ProcessLookupError):
                platform.current().contain(bridge.pid).kill()
            with contextlib.suppress(ProcessLookupError, ValueError, FileNotFoundError):
                platform.current().contain(int(pid_file.read_text())).kill()  # the orphaned hook
            await bridge.wait()
    assert freed_after <= TTL + 1.5
    assert completed["data"]["budget"]["outcome"] == "acquired"
    most, holders = max_holders(etcd)
    assert (most, holders) == (1, ["vm-0", "vm-1"])


def coordination_check(run: Running) -> tuple[bool, str]:
    """The `coordination` line of the bridge's /readyz."""
    monitor = HealthMonitor()
    monitor.attach(run.bridge)
    (check,) = [c for c in monitor.readiness() if c.name == "coordination"]
    return check.ok, check.detail


async def test_while_etcd_is_down_a_budgeted_hook_waits_and_readyz_says_so(
    azure_sim: Simulator, etcd: EtcdServer, tmp_path: Path
) -> None:
    log = tmp_path / "drains.log"
    settings = {
        "coordination": coordination(etcd, on_unavailable="wait"),
        "hooks": [drain_hook(log)],
    }
    async with running_group(azure_sim, tmp_path, ["vm-0", "vm-1"], settings) as (_group, runs):
        first = azure_sim.azure.add_event(event_type="Reboot", resources=["vm-0"])
        await runs["vm-0"].sink.wait_for_type(HOOK_COMPLETED)  # vm-0 holds the slot
        etcd.stop()
        azure_sim.azure.add_event(event_type="Reboot", resources=["vm-1"])
        waiting = budget_of(runs["vm-1"])
        await eventually(lambda: waiting.waiting == 1 and waiting.unavailable > 0)
        ok, detail = coordination_check(runs["vm-1"])
        assert not ok
        assert "unavailable, disruptive actions wait" in detail
        etcd.start()
        await eventually(lambda: coordination_check(runs["vm-1"])[0])
        # The holder kept its slot across the restart (etcd keeps leases); vm-1 still waits.
        assert list(etcd.keys(SLOTS).values()) == ["vm-0"]
        assert waiting.waiting == 1
        assert "vm-1" not in text(log)
        azure_sim.azure.remove_event(first)
        (completed,) = await runs["vm-1"].sink.wait_for_type(HOOK_COMPLETED)
    assert completed["data"]["budget"]["outcome"] == "acquired"
    assert completed["data"]["budget"]["waited_seconds"] > 0
    assert max_holders(etcd) == (1, ["vm-0", "vm-1"])


async def test_while_etcd_is_down_proceed_acts_without_a_slot_and_says_so(
    azure_sim: Simulator, etcd: EtcdServer, tmp_path: Path
) -> None:
    log = tmp_path / "drains.log"
    settings = {
        "coordination": coordination(etcd, on_unavailable="proceed"),
        "hooks": [drain_hook(log)],
    }
    async with running_group(azure_sim, tmp_path, ["vm-0"], settings) as (_group, runs):
        run = runs["vm-0"]
        etcd.stop()
        azure_sim.azure.add_event(event_type="Reboot", resources=["vm-0"])
        (blind,) = await run.sink.wait_for_type(HOOK_COMPLETED)
        ok, detail = coordination_check(run)
        assert ok
        assert "acting without slots" in detail
        etcd.start()
        azure_sim.azure.add_event(event_type="Freeze", resources=["vm-0"])
        _, counted = await run.sink.wait_for_type(HOOK_COMPLETED, 2)
    assert blind["data"]["outcome"] == "succeeded"
    assert blind["data"]["budget"]["outcome"] == "unavailable"
    assert blind["data"]["budget"]["acquired_at"] is None
    assert counted["data"]["budget"]["outcome"] == "acquired"
    assert budget_of(run).takes[("hook drain", "unavailable")] == 1


async def test_approvals_take_turns_and_one_that_waits_past_not_before_is_not_sent(
    azure_sim: Simulator, etcd: EtcdServer, tmp_path: Path
) -> None:
    settings = {
        "coordination": coordination(etcd),
        "approval": {"leader": "self", "preset": "vendor-sample"},
    }
    names = ["vm-0", "vm-1", "vm-2"]
    async with running_group(azure_sim, tmp_path, names, settings) as (_group, runs):
        # User reboots: the preset approves them at once, the budget lets one at a time.
        for name in ("vm-0", "vm-1"):
            azure_sim.azure.add_event(
                event_type="Reboot", source="User", resources=[name], started_for=1.0
            )
        await runs["vm-0"].sink.wait_for_type(APPROVED, timeout=20)
        await runs["vm-1"].sink.wait_for_type(APPROVED, timeout=20)
        # vm-2's approval waits behind a slot that never frees; its event starts by itself.
        held = azure_sim.azure.add_event(
            event_type="Reboot", source="User", resources=["vm-0"], auto_complete=False
        )
        await eventually(lambda: len(azure_sim.azure.approval_log) == 3)
        late = azure_sim.azure.add_event(
            event_type="Reboot", source="User", resources=["vm-2"], not_before_in=1.5
        )
        await eventually(lambda: ("reboot", "started") in runs["vm-2"].sink.summary())
        await runs["vm-2"].settle(0.5)
        azure_sim.azure.remove_event(held)
    approvals = [(a.client, a.event_id) for a in azure_sim.azure.approval_log]
    clients = [client for client, _ in approvals]
    assert sorted(clients[:2]) == ["vm-0", "vm-1"]  # whoever came first; one at a time
    assert clients[2:] == ["vm-0"]
    assert late not in [event_id for _, event_id in approvals]
    assert runs["vm-2"].sink.of_type(APPROVED) == []
    assert budget_of(runs["vm-2"]).takes[("approval", "withdrawn")] == 1
    for name in ("vm-0", "vm-1"):
        (first, *_) = runs[name].sink.of_type(APPROVED)
        assert first["data"]["budget"]["outcome"] == "acquired"
    most, _ = max_holders(etcd)
    assert most == 1


async def test_doctor_and_metrics_show_the_engine_the_group_and_the_slot(
    azure_sim: Simulator, etcd: EtcdServer, tmp_path: Path
) -> None:
    log = tmp_path / "drains.log"
    settings = {"coordination": coordination(etcd), "hooks": [drain_hook(log)]}
    async with running_group(azure_sim, tmp_path, ["vm-0"], settings) as (group, runs):
        run = runs["vm-0"]
        azure_sim.azure.add_event(event_type="Reboot", resources=["vm-0"])
        await run.sink.wait_for_type(HOOK_COMPLETED)
        monitor = HealthMonitor()
        monitor.attach(run.bridge)
        text = await metrics.render(monitor)
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert families["maintenance_bridge_coordination_slots_held"].samples[0].value == 1
        assert families["maintenance_bridge_coordination_up"].samples[0].value == 1
        (take,) = families["maintenance_bridge_coordination_takes"].samples
        assert (take.labels, take.value) == ({"action": "hook drain", "outcome": "acquired"}, 1)

        config = bridge_config(
            azure_sim,
            tmp_path / "doctor",
            {"coordination": coordination(etcd)},
            provider="azure",
            azure={"imds_url": group.imds_url("vm-0")},
        )
        findings = {f.check: f for f in await Doctor(config, None, timeout=2).run()}
        assert findings["coordination"].verdict == "ok"
        assert "etcd 3." in findings["coordination"].detail
        assert "group fleet: 1 of 1 slot(s) taken (vm-0)" in findings["coordination"].detail
        etcd.stop()
        findings = {f.check: f for f in await Doctor(config, None, timeout=2).run()}
        assert findings["coordination"].verdict == "fail"
        assert "on_unavailable = wait" in findings["coordination"].detail
        etcd.start()


@pytest.mark.parametrize("on_timeout", ["run", "skip"])
async def test_a_hook_without_a_slot_by_its_deadline_follows_on_budget_timeout(
    azure_sim: Simulator, etcd: EtcdServer, tmp_path: Path, on_timeout: str
) -> None:
    log = tmp_path / "drains.log"
    # timeout 1 s: the hook stops waiting 1 s before not_before, leaving it its whole time.
    hook = drain_hook(log, on_budget_timeout=on_timeout, timeout=1.0)
    settings = {"coordination": coordination(etcd), "hooks": [hook]}
    async with running_group(azure_sim, tmp_path, ["vm-0", "vm-1"], settings) as (_group, runs):
        azure_sim.azure.add_event(event_type="Reboot", resources=["vm-0"])
        await runs["vm-0"].sink.wait_for_type(HOOK_COMPLETED)  # vm-0 keeps the slot
        azure_sim.azure.add_event(event_type="Reboot", resources=["vm-1"], not_before_in=3.0)
        (completed,) = await runs["vm-1"].sink.wait_for_type(HOOK_COMPLETED)
    data = completed["data"]
    assert data["budget"]["outcome"] == "timed-out"
    assert data["budget"]["acquired_at"] is None
    assert data["budget"]["waited_seconds"] > 0.5
    if on_timeout == "run":
        assert data["outcome"] == "succeeded"
        assert "vm-1 end" in log.read_text()
    else:
        assert data["outcome"] == "skipped"
        assert "no budget slot of fleet free before its deadline" in data["error"]
        assert "vm-1" not in text(log)
    assert budget_of(runs["vm-1"]).takes[("hook drain", "timed-out")] == 1
    assert max_holders(etcd) == (1, ["vm-0"])


async def test_a_hook_still_waiting_at_shutdown_runs_after_the_restart(
    azure_sim: Simulator, etcd: EtcdServer, tmp_path: Path
) -> None:
    log = tmp_path / "drains.log"
    settings = {"coordination": coordination(etcd), "hooks": [drain_hook(log)]}
    async with AzureGroup(azure_sim, ["vm-0", "vm-1"]) as group:

        def vm(name: str, sink: str) -> contextlib.AbstractAsyncContextManager[Running]:
            return running_bridge(
                azure_sim,
                tmp_path / name,
                AZURE,
                sink=CheckedSink(sink),
                settings=settings,
                azure={"imds_url": group.imds_url(name)},
            )

        async with vm("vm-0", "vm-0") as holder:
            first = azure_sim.azure.add_event(event_type="Reboot", resources=["vm-0"])
            await holder.sink.wait_for_type(HOOK_COMPLETED)  # vm-0 holds the slot
            async with vm("vm-1", "vm-1 before") as before:
                azure_sim.azure.add_event(event_type="Reboot", resources=["vm-1"])
                await eventually(lambda: budget_of(before).waiting == 1)
            assert before.sink.of_type(HOOK_COMPLETED) == []  # not reported: still planned
            async with vm("vm-1", "vm-1 after") as after:
                await eventually(lambda: budget_of(after).waiting == 1)
                azure_sim.azure.remove_event(first)
                (completed,) = await after.sink.wait_for_type(HOOK_COMPLETED)
    assert completed["data"]["outcome"] == "succeeded"
    assert text(log).count("vm-1 start") == 1
    assert max_holders(etcd) == (1, ["vm-0", "vm-1"])


def test_the_coordination_table_is_validated_like_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def problems(raw: dict[str, Any]) -> list[str]:
        with pytest.raises(ConfigError) as caught:
            parse_config(raw)
        return caught.value.problems

    hook = {"command": ["/bin/true"], "budget": True}
    assert problems({"hooks": [hook]}) == ["hooks[0].budget: needs a [coordination] table"]
    assert problems({"coordination": {"endpoints": []}}) == [
        "coordination.endpoints: must have at least 1 item"
    ]
    assert problems({"coordination": {"endpoints": ["etcd:2379"]}}) == [
        "coordination.endpoints[0]: must be an http:// or https:// URL"
    ]
    endpoints = ["http://etcd:2379"]
    assert problems({"coordination": {"endpoints": endpoints, "on_unavailable": "retry"}}) == [
        "coordination.on_unavailable: must be one of 'proceed', 'wait'"
    ]
    assert problems({"coordination": {"endpoints": endpoints, "budget": 0}}) == [
        "coordination.budget: must be >= 1"
    ]
    assert problems({"coordination": {"endpoints": ["http://etcd:2379"], "username": "mb"}}) == [
        "coordination.password: username and password go together"
    ]
    monkeypatch.setenv("ETCD_PASSWORD", "s3cret")
    config = parse_config(
        {
            "coordination": {
                "endpoints": ["http://etcd:2379"],
                "username": "mb",
                "password": "env:ETCD_PASSWORD",
            },
            "hooks": [{**hook, "on_budget_timeout": "skip"}],
        }
    )
    assert config.coordination is not None
    assert config.coordination.password is not None
    assert config.coordination.password.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(config)
    assert config.hooks[0].on_budget_timeout == "skip"


async def test_with_etcd_authentication_the_bridge_logs_in_and_a_wrong_password_is_named(
    etcd: EtcdServer,
) -> None:
    etcd.enable_auth("bridge", "pw-of-bridge", PREFIX)
    right = validate(Coordination, coordination(etcd, username="bridge", password="pw-of-bridge"))
    budget = build(right)
    instance = _instance(name="vm-0")
    try:
        grant = await budget.take("n1", instance, action="test", deadline=None, wanted=lambda: True)
        assert grant.outcome == "acquired"
        assert etcd.keys(SLOTS) == {f"{SLOTS}slot-0": "vm-0"}
        budget.release("n1")
        await eventually(lambda: etcd.keys(SLOTS) == {})
    finally:
        await budget.aclose()
    wrong = validate(Coordination, coordination(etcd, username="bridge", password="guess"))
    budget = build(msgspec.structs.replace(wrong, on_unavailable="proceed"))
    try:
        grant = await budget.take("n2", instance, action="test", deadline=None, wanted=lambda: True)
    finally:
        await budget.aclose()
    assert grant.outcome == "unavailable"
    ok, detail = budget.check()
    assert ok
    assert "etcd refused the credentials" in detail
    assert "guess" not in detail


async def test_over_tls_with_a_client_certificate(etcd: EtcdServer, tmp_path: Path) -> None:
    (tmp_path / "server").mkdir()
    (tmp_path / "client").mkdir()
    server, client = self_signed(tmp_path / "server"), self_signed(tmp_path / "client")
    etcd.stop()
    etcd.with_tls(server, client)
    etcd.start()
    instance = _instance(name="vm-0")
    settings = coordination(etcd, ca_file=str(server[0]), on_unavailable="proceed")
    with_cert = validate(
        Coordination, {**settings, "cert_file": str(client[0]), "key_file": str(client[1])}
    )
    budget = build(with_cert)
    try:
        grant = await budget.take("n1", instance, action="test", deadline=None, wanted=lambda: True)
    finally:
        await budget.aclose()
    assert grant.outcome == "acquired"
    assert etcd.keys(SLOTS) == {f"{SLOTS}slot-0": "vm-0"}
    budget = build(validate(Coordination, settings))  # no client certificate: refused
    try:
        grant = await budget.take("n2", instance, action="test", deadline=None, wanted=lambda: True)
    finally:
        await budget.aclose()
    assert grant.outcome == "unavailable"


async def test_a_restarted_holder_takes_its_own_slot_over_while_its_notice_is_in_force(
    azure_sim: Simulator, etcd: EtcdServer, tmp_path: Path
) -> None:
    log = tmp_path / "drains.log"
    settings = {"coordination": coordination(etcd), "hooks": [drain_hook(log)]}
    async with AzureGroup(azure_sim, ["vm-0"]) as group:

        def vm_0(sink: str) -> contextlib.AbstractAsyncContextManager[Running]:
            return running_bridge(
                azure_sim,
                tmp_path / "vm-0",
                AZURE,
                sink=CheckedSink(sink),
                settings=settings,
                azure={"imds_url": group.imds_url("vm-0")},
            )

        async with vm_0("before") as before:
            notice = azure_sim.azure.add_event(event_type="Reboot", resources=["vm-0"])
            await before.sink.wait_for_type(HOOK_COMPLETED)
        (old_lease,) = etcd.leases(SLOTS).values()  # a stop does not give the slot back
        async with vm_0("after") as after:
            await eventually(lambda: budget_of(after).held == 1)
            (new_lease,) = etcd.leases(SLOTS).values()
            assert new_lease != old_lease
            await eventually(lambda: not etcd.lease_alive(old_lease), timeout=TTL + 2)
            assert etcd.keys(SLOTS) == {f"{SLOTS}slot-0": "vm-0"}  # held on the new lease
            azure_sim.azure.remove_event(notice)
            await eventually(lambda: etcd.keys(SLOTS) == {})
    assert text(log).count("vm-0 start") == 1
    assert max_holders(etcd) == (1, ["vm-0"])


async def test_a_holder_cut_off_from_etcd_reports_its_slot_unrenewed_before_another_takes_it(
    azure_sim: Simulator, etcd: EtcdServer, tmp_path: Path
) -> None:
    """vm-0 holds the slot for a maintenance that cannot be stopped (its hook still runs)
    when its traffic to etcd is blackholed. What is guaranteed: vm-0 reports it (log,
    metric, a `budget.unrenewed` audit event) at its local deadline, before the lease can
    expire and vm-1 take the slot. What is not: vm-1 then drains while vm-0's maintenance
    goes on (two at once), which the docs say."""
    log = tmp_path / "drains.log"
    async with (
        Blackhole(etcd.client_port) as proxy,
        AzureGroup(azure_sim, ["vm-0", "vm-1"]) as group,
        contextlib.AsyncExitStack() as stack,
    ):
        runs = {}
        for name, endpoint, seconds in (("vm-0", proxy.url, 8.0), ("vm-1", etcd.url, 0.3)):
            settings = {
                "coordination": coordination(etcd, endpoints=[endpoint]),
                "hooks": [drain_hook(log, seconds)],
            }
            runs[name] = await stack.enter_async_context(
                running_bridge(
                    azure_sim,
                    tmp_path / name,
                    AZURE,
                    sink=CheckedSink(name),
                    settings=settings,
                    azure={"imds_url": group.imds_url(name)},
                )
            )
        azure_sim.azure.add_event(event_type="Reboot", resources=["vm-0"])
        await eventually(lambda: "vm-0 start" in text(log), timeout=30)
        assert list(etcd.keys(SLOTS).values()) == ["vm-0"]
        azure_sim.azure.add_event(event_type="Reboot", resources=["vm-1"])
        await eventually(lambda: budget_of(runs["vm-1"]).waiting == 1)

        proxy.cut()
        (unrenewed,) = await runs["vm-0"].sink.wait_for_type(BUDGET_UNRENEWED, timeout=TTL)
        assert budget_of(runs["vm-0"]).unrenewed == 1
        assert "vm-1 start" not in text(log)  # reported before the slot could be taken
        budget = unrenewed["data"]["budget"]
        assert budget["member"] == "vm-0"
        assert budget["slot"] == f"{SLOTS}slot-0"
        assert budget["lease_ttl_seconds"] == TTL
        assert "not renewed within" in budget["reason"]
        monitor = HealthMonitor()
        monitor.attach(runs["vm-0"].bridge)
        families = {
            f.name: f for f in text_string_to_metric_families(await metrics.render(monitor))
        }
        (sample,) = families["maintenance_bridge_coordination_slots_unrenewed"].samples
        assert sample.value == 1

        # Not guaranteed: once the lease expired, vm-1 takes the slot while vm-0's hook
        # (its maintenance) still runs.
        await eventually(lambda: "vm-1 start" in text(log), timeout=TTL + 5)
        assert "vm-0 end" not in text(log)
        (completed,) = await runs["vm-1"].sink.wait_for_type(HOOK_COMPLETED, timeout=10)
        assert completed["data"]["budget"]["acquired_at"] > budget["unrenewed_at"]
