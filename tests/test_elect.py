"""`maintenance-bridge elect`: leadership on a real etcd election, driven by the real bridges'
`/v1/eligible`, handed away from a VM that gets a notice and never back while it blocks.

Three VMs of one simulated Azure group, each with its bridge (and its listener serving the
status API) and its `elect` wrapper run as a process around a command that logs when it
leads and when it is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from bridge.actions.coordination.elect import Elector
from bridge.actions.coordination.settings import Coordination
from bridge.config import Listener
from bridge.infra import platform
from bridge.infra.platform.windows import Windows
from bridge.infra.validation import validate
from bridge.providers.azure.simulated.group import AzureGroup
from bridge.runner import ProviderName
from bridge.simulator import Simulator
from bridge.surface.health import HealthMonitor
from bridge.surface.routes import serving
from tests.etcd_server import Blackhole, EtcdServer, b64
from tests.etcd_server import etcd as etcd
from tests.support import CheckedSink, alive, eventually, running_bridge
from tests.test_platform import RecordingWin32

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


# -- the leader's command never outlives its lease nor its `elect` ---------------------------
#
# Here `elect` runs as a real process on a real etcd around a real command; the bridge's
# `/v1/eligible` is stood in for by a loopback HTTP server that always answers 200 (these
# tests are about holding the command, not about eligibility, which the tests above cover).
# The command appends its own records to a file: `lead NAME PID GRANDCHILD TOKEN LEASE` when
# it starts (after starting a grandchild that sleeps) with its environment's
# MB_FENCING_TOKEN, MB_LEASE_ID and MB_LEADER_KEY, `beat NAME PID` every 50 ms while it
# runs, `stop NAME PID` on SIGTERM (or `ignore NAME PID` if told to be stubborn).

RECORDER = """
import os, signal, subprocess, sys, time
name, log = os.environ["NAME"], open(os.environ["LOG"], "a")
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
def stop(*_):
    log.write(f"stop {name} {os.getpid()}\\n"); log.flush(); sys.exit(0)
def ignore(*_):
    log.write(f"ignore {name} {os.getpid()}\\n"); log.flush()
signal.signal(signal.SIGTERM, ignore if os.environ.get("STUBBORN") else stop)
token, lease = os.environ["MB_FENCING_TOKEN"], os.environ["MB_LEASE_ID"]
key = os.environ["MB_LEADER_KEY"]
log.write(f"lead {name} {os.getpid()} {child.pid} {token} {lease} {key}\\n"); log.flush()
while True:
    time.sleep(0.05)
    log.write(f"beat {name} {os.getpid()}\\n"); log.flush()
"""


@dataclass(frozen=True)
class Record:
    what: str
    name: str
    pid: int
    grandchild: int = 0
    token: int = 0
    lease: int = 0
    key: str = ""


def records(log: Path, *, beats: bool = False) -> list[Record]:
    out = []
    for line in lines(log):
        what, name, *fields = line.split()
        if what == "beat" and not beats:
            continue
        if what != "lead":
            out.append(Record(what, name, int(fields[0])))
            continue
        pid, grandchild, token, lease = map(int, fields[:4])
        out.append(Record(what, name, pid, grandchild, token, lease, fields[4]))
    return out


def led(log: Path) -> list[Record]:
    return [record for record in records(log) if record.what == "lead"]


def fenced_write(etcd: EtcdServer, leader: Record, value: str) -> bool:
    """docs/coordination.md's fenced write: a put conditional on the leadership's key still
    having been created at its fencing token; whether etcd took it."""
    compare = {
        "key": b64(leader.key),
        "target": "CREATE",
        "result": "EQUAL",
        "create_revision": str(leader.token),
    }
    put = {"request_put": {"key": b64("/app/config"), "value": b64(value)}}
    return bool(etcd.call("kv/txn", {"compare": [compare], "success": [put]}).get("succeeded"))


def has_led(log: Path, count: int) -> bool:
    return len(led(log)) == count


@contextlib.asynccontextmanager
async def always_eligible() -> AsyncIterator[str]:
    """A loopback `/v1/eligible` that answers 200 to every request (keep-alive)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}/v1/eligible"


async def candidate(
    name: str,
    endpoint: str,
    eligible: str,
    log: Path,
    *,
    ttl: int = 3,
    grace: float = 5,
    stubborn: bool = False,
) -> asyncio.subprocess.Process:
    """`elect` for candidate `name` of election `scheduler`, around RECORDER."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge",
        "elect",
        "--endpoint",
        endpoint,
        "--eligible-url",
        eligible,
        "--value",
        name,
        "--ttl",
        str(ttl),
        "--interval",
        "0.2",
        "--grace",
        str(grace),
        "scheduler",
        "--",
        sys.executable,
        "-c",
        RECORDER,
        env={**os.environ, "NAME": name, "LOG": str(log), "STUBBORN": "1" if stubborn else ""},
        start_new_session=True,
    )


@contextlib.asynccontextmanager
async def candidates() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """Every `elect` started is ended at the end (SIGTERM, then SIGKILL), and every command
    it ran must be gone by then."""
    started: list[asyncio.subprocess.Process] = []
    try:
        yield started
    finally:
        for process in started:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        for process in started:
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()


def running(record: Record) -> bool:
    return alive(record.pid) or alive(record.grandchild)


async def test_kill_9_of_the_leaders_elect_ends_its_command_and_grandchild_within_a_second(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    log = tmp_path / "records.log"
    async with always_eligible() as eligible, candidates() as started:
        for name in ("vm-0", "vm-1"):
            started.append(await candidate(name, etcd.url, eligible, log))
        await eventually(lambda: len(led(log)) == 1, timeout=30)
        (first,) = led(log)
        assert running(first)
        elect = started[int(first.name[-1])]

        elect.kill()  # SIGKILL, as the OOM killer does: elect alone
        killed = time.monotonic()
        await eventually(lambda: not running(first), timeout=1.0)
        gone_after = time.monotonic() - killed
        assert gone_after < 1.0

        await eventually(lambda: len(led(log)) == 2, timeout=30)
        second = led(log)[1]
        assert second.name != first.name
        assert not running(first)  # never two commands: the first was gone before
        assert second.token > first.token
        assert [r.what for r in records(log)] == ["lead", "lead"]  # killed, not stopped


async def test_a_leader_cut_off_from_etcd_stops_its_command_before_another_is_elected(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    log = tmp_path / "records.log"
    async with (
        Blackhole(etcd.client_port) as proxy,
        always_eligible() as eligible,
        candidates() as started,
    ):
        # TTL 6: the cut-off leader's command is gone by 7/8 TTL after its last renewal,
        # 0.75 s before its lease can expire at etcd (the loaded machine's slack).
        started.append(await candidate("vm-0", proxy.url, eligible, log, ttl=6))
        await eventually(lambda: len(led(log)) == 1, timeout=30)
        started.append(await candidate("vm-1", etcd.url, eligible, log, ttl=6))
        await eventually(lambda: len(etcd.keys(ELECTION)) == 2, timeout=30)

        proxy.cut()
        cut = time.monotonic()
        await eventually(lambda: len(led(log)) == 2, timeout=30)
        elected_after = time.monotonic() - cut
        first, second = led(log)
        assert (first.name, second.name) == ("vm-0", "vm-1")
        assert not running(first)
        # From the commands' own records: the cut-off leader stopped (SIGTERM, its own
        # line) before the other one started.
        assert [(r.what, r.name) for r in records(log)] == [
            ("lead", "vm-0"),
            ("stop", "vm-0"),
            ("lead", "vm-1"),
        ]
        assert second.token > first.token
        # The last renewal was sent at most TTL/3 before the cut: the lease lived on for at
        # least 2/3 TTL after it, and nobody was elected meanwhile.
        assert elected_after >= 6 * 2 / 3 - 0.1
        assert started[0].returncode is None  # vm-0's elect lives on, a candidate again


async def test_a_cut_off_leader_whose_command_ignores_sigterm_is_killed_before_another_leads(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    """`--grace 60` is cut to the lease: the command is killed 7/8 TTL after the last
    renewal sent, and its own heartbeats stop before the next leader's first record."""
    log = tmp_path / "records.log"
    async with (
        Blackhole(etcd.client_port) as proxy,
        always_eligible() as eligible,
        candidates() as started,
    ):
        started.append(
            await candidate("vm-0", proxy.url, eligible, log, ttl=6, grace=60, stubborn=True)
        )
        await eventually(lambda: len(led(log)) == 1, timeout=30)
        started.append(await candidate("vm-1", etcd.url, eligible, log, ttl=6))
        await eventually(lambda: len(etcd.keys(ELECTION)) == 2, timeout=30)
        proxy.cut()
        await eventually(lambda: len(led(log)) == 2, timeout=30)
        first, _second = led(log)
        assert not running(first)
    trail = [(r.what, r.name) for r in records(log, beats=True)]
    handed = trail.index(("lead", "vm-1"))
    ignored = trail.index(("ignore", "vm-0"))
    assert ignored < handed  # asked to stop at the deadline...
    assert ("beat", "vm-0") in trail[ignored:handed]  # ...went on (it ignores SIGTERM)...
    assert ("beat", "vm-0") not in trail[handed:]  # ...and was killed before vm-1 led


async def test_three_hand_overs_give_three_strictly_increasing_fencing_tokens(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    log = tmp_path / "records.log"
    async with always_eligible() as eligible, candidates() as started:
        electors = {}
        for name in ("vm-0", "vm-1"):
            electors[name] = await candidate(name, etcd.url, eligible, log)
            started.append(electors[name])
        await eventually(lambda: len(led(log)) == 1, timeout=30)
        for count in (2, 3, 4):
            leader = led(log)[-1]
            waiting = next(name for name in electors if name != leader.name)
            await eventually(lambda: len(etcd.keys(ELECTION)) == 2, timeout=30)
            # The leader's key in etcd was created at the revision its command was given.
            (key,) = (k for k, v in etcd.keys(ELECTION).items() if v == leader.name)
            (kv,) = etcd.call("kv/range", {"key": b64(key)})["kvs"]
            assert int(kv["create_revision"]) == leader.token
            assert int(kv["lease"]) == leader.lease
            assert key == leader.key
            assert fenced_write(etcd, leader, f"from {leader.token}")
            electors[leader.name].send_signal(signal.SIGTERM)  # hand over
            assert await asyncio.wait_for(electors[leader.name].wait(), 30) == 0
            await eventually(functools.partial(has_led, log, count), timeout=30)
            assert led(log)[-1].name == waiting
            electors[leader.name] = await candidate(leader.name, etcd.url, eligible, log)
            started.append(electors[leader.name])
        tokens = [record.token for record in led(log)]
        assert tokens == sorted(set(tokens))  # strictly increasing, four leaderships
        # Every deposed leader's fenced write is refused; the current one's is taken.
        *deposed, current = led(log)
        assert not any(fenced_write(etcd, old, "stale") for old in deposed)
        assert fenced_write(etcd, current, "current")
        assert etcd.keys("/app/config") == {"/app/config": "current"}
        assert [r.what for r in records(log)] == ["lead", "stop"] * 3 + ["lead"]


# -- Windows, through the seam ----------------------------------------------------------


class JobsOnLinux(RecordingWin32):
    """The pywin32 recorder, plus what Windows would do to the real process, done the Linux
    way so that the command obeys here: Ctrl+Break is SIGTERM to its group, and
    TerminateJobObject SIGKILL to it."""

    def ctrl_break(self, pid: int) -> None:
        super().ctrl_break(pid)
        platform.current().contain(pid).terminate()

    def terminate_job(self, job: object) -> None:
        super().terminate_job(job)
        platform.current().contain(int(str(job).rsplit("-", 1)[1])).kill()


@dataclass
class WindowsOnLinux(Windows):
    def spawn_options(self) -> dict[str, Any]:
        """The one part that cannot run here: `creationflags` exist on Windows only."""
        return {"start_new_session": True}


@pytest.mark.posix
async def test_on_windows_the_leaders_command_is_held_by_its_job_object(
    etcd: EtcdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "records.log"
    monkeypatch.setenv("NAME", "vm-0")
    monkeypatch.setenv("LOG", str(log))
    api = JobsOnLinux()
    command = [sys.executable, "-c", RECORDER]
    settings = validate(Coordination, {"endpoints": [etcd.url]})
    async with always_eligible() as eligible:
        elector = Elector(
            settings,
            "scheduler",
            command,
            eligible_url=eligible,
            value="vm-0",
            ttl=3,
            interval=0.2,
            grace=5,
            system=WindowsOnLinux(api),
        )
        # No watchdog: the Job Object (kill on close, its one handle ours) is what ends the
        # command with `elect` on Windows.
        assert elector.argv == command
        run = asyncio.create_task(elector.run())
        await eventually(lambda: len(led(log)) == 1, timeout=30)
        (record,) = led(log)
        job = f"job-of-{record.pid}"
        assert api.calls == [("create_job", record.pid)]  # contained as soon as started
        elector.stop.set()
        assert await asyncio.wait_for(run, 30) == 0
        await elector.aclose()
    assert api.calls == [
        ("create_job", record.pid),
        ("ctrl_break", record.pid),  # asked to stop...
        ("terminate_job", job),  # ...what is left of the job killed...
        ("close_job", job),  # ...and the handle closed last
    ]
    assert [r.what for r in records(log)] == ["lead", "stop"]
    assert not running(record)


def test_on_windows_without_pywin32_elect_refuses_to_run_a_command_it_cannot_hold(
    etcd: EtcdServer,
) -> None:
    settings = validate(Coordination, {"endpoints": [etcd.url]})
    with pytest.raises(RuntimeError, match=r"Job Object.*pywin32"):
        Elector(settings, "scheduler", ["true"], system=Windows(RecordingWin32(jobs=False)))


# -- the POSIX watchdog that holds the command ----------------------------------------------


@pytest.mark.posix
async def test_the_watchdog_exits_as_its_command_did_and_ends_what_the_command_left(
    tmp_path: Path,
) -> None:
    system = platform.current()
    pid_file = tmp_path / "leftover"
    process = await asyncio.create_subprocess_exec(
        *system.held(["sh", "-c", f"sleep 600 & echo $! > {pid_file}; exit 3"]),
        **system.spawn_options(),
    )
    assert await asyncio.wait_for(process.wait(), 10) == 3
    assert not alive(int(pid_file.read_text()))

    killed = await asyncio.create_subprocess_exec(
        *system.held(["sh", "-c", "kill -TERM $$"]), **system.spawn_options()
    )
    assert await asyncio.wait_for(killed.wait(), 10) == -signal.SIGTERM


@pytest.mark.posix
@pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="Linux's: /proc and a child subreaper"
)
async def test_a_grandchild_in_a_session_of_its_own_still_ends_with_the_watchdogs_parent(
    tmp_path: Path,
) -> None:
    """The parent (standing in for `elect`) is killed with -9; the command had started a
    grandchild that left its process group for a session of its own (as a daemon does)."""
    system = platform.current()
    # The subshell that starts it exits at once: the grandchild is an orphan, re-parented.
    held = system.held(["sh", "-c", '(setsid sleep 600 & echo $! > "$PID_FILE"); sleep 600'])
    pid_file = tmp_path / "daemon"
    parent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import subprocess, sys; subprocess.Popen(sys.argv[1:], start_new_session=True).wait()",
        *held,
        env={**os.environ, "PID_FILE": str(pid_file)},
    )
    await eventually(lambda: pid_file.exists() and pid_file.read_text().strip())
    daemon = int(pid_file.read_text())
    await eventually(lambda: alive(daemon))
    assert psutil.Process(daemon).ppid() != parent.pid
    parent.kill()
    await parent.wait()
    await eventually(lambda: not alive(daemon), timeout=1.0)
