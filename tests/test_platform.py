"""The platform layer: the POSIX strategy for real, the Windows strategy through its seam.

`bridge.infra.platform.windows.Windows` makes every Windows call through `Win32`; here a recorder
stands in for pywin32 (which cannot run on Linux) and the tests check which calls are made,
with what, and when. The same goes for the Windows service
(`bridge.infra.platform.services.ServiceManager`, run by
`bridge.app.service`).
What is real: the POSIX strategy, the lock, the bridge run that a service stop request ends,
and the walk over the sources that keeps every platform difference in `bridge/infra/platform/`.
"""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PureWindowsPath

import pytest
import yaml

from bridge.actions import hooks
from bridge.app import service
from bridge.config import Hook, load_config
from bridge.infra import platform, statelock
from bridge.infra.platform.base import Platform
from bridge.infra.platform.services import ServiceProgram, ServiceRegistration
from bridge.infra.platform.windows import CREATE_NEW_PROCESS_GROUP, Windows
from bridge.infra.prometheus import Exposition
from bridge.simulator import Simulator, SimulatorThread
from bridge.surface import metrics
from tests.support import alive, azure_file_config, eventually

ROOT = Path(__file__).resolve().parent.parent

# -- the rule: every difference in bridge/infra/platform/ ----------------------------------------

#: Modules that exist on one system only (POSIX-only first, then Windows-only).
ONE_SYSTEM_MODULES = frozenset(
    {"fcntl", "resource", "termios", "tty", "pty", "pwd", "grp", "posix", "syslog", "crypt"}
    | {"msvcrt", "winreg", "winsound", "_winapi", "servicemanager", "pywintypes"}
)


def _violations(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if top in ONE_SYSTEM_MODULES or top.startswith("win32"):
                found.append(f"{path}:{line}: imports {name}")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            dotted = f"{node.value.id}.{node.attr}"
            if dotted in ("sys.platform", "os.name", "sys.getwindowsversion"):
                found.append(f"{path}:{node.lineno}: branches on {dotted}")
        if isinstance(node, ast.Attribute) and node.attr == "add_signal_handler":
            found.append(f"{path}:{node.lineno}: add_signal_handler (not on Windows)")
    return found


def test_no_platform_difference_outside_the_platform_layer() -> None:
    layer = ROOT / "bridge" / "infra" / "platform"
    sources = [
        path
        for top in ("bridge", "sinks", "tests", "bench")
        for path in sorted((ROOT / top).rglob("*.py"))
        if layer not in path.parents
    ]
    assert len(sources) > 50
    assert [v for path in sources for v in _violations(path)] == []


def test_the_rule_sees_what_it_forbids(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import sys, fcntl\nfrom resource import getrusage\nimport win32job\n"
        "if sys.platform == 'win32': pass\nloop.add_signal_handler(1, print)\n"
    )
    assert len(_violations(bad)) == 5


def test_both_strategies_implement_the_interface() -> None:
    strategies: list[Platform] = [platform.current(), Windows(RecordingWin32())]
    assert strategies[0].name == ("windows" if platform.is_windows() else "posix")
    assert strategies[1].name == "windows"


# -- POSIX, for real ----------------------------------------------------------------------


@pytest.mark.posix
def test_posix_lock_is_exclusive_and_ends_with_the_file(tmp_path: Path) -> None:
    system = platform.current()
    path = tmp_path / "lock"
    first = os.open(path, os.O_RDWR | os.O_CREAT)
    second = os.open(path, os.O_RDWR)
    try:
        assert system.lock(first)
        assert not system.lock(second)
        os.close(first)
        assert system.lock(second)
    finally:
        os.close(second)


def test_state_lock_names_the_holder_and_is_released_on_exit(tmp_path: Path) -> None:
    state = tmp_path / "new" / "state"
    with statelock.holding(state) as lock:
        assert lock.read_text().split() == [str(os.getpid())]
        with pytest.raises(statelock.StateDirInUse) as refused, statelock.holding(state):
            pass
        assert refused.value.holder == os.getpid()
        assert str(state) in str(refused.value)
    with statelock.holding(state):
        pass


@pytest.mark.posix
async def test_posix_process_tree_is_the_hooks_process_group() -> None:
    system = platform.current()
    process = await asyncio.create_subprocess_exec(
        "sh",
        "-c",
        "sleep 600 & echo $!; wait",
        stdout=asyncio.subprocess.PIPE,
        **system.spawn_options(),
    )
    assert process.stdout is not None
    grandchild = int(await process.stdout.readline())
    tree = system.contain(process.pid)
    tree.terminate()
    assert await asyncio.wait_for(process.wait(), 10) != 0
    tree.kill()  # idempotent once the group is gone
    await eventually(lambda: not alive(grandchild))
    tree.close()


@pytest.mark.posix
def test_posix_figures_and_directory_fsync(tmp_path: Path) -> None:
    system = platform.current()
    system.fsync_directory(tmp_path)
    figures = system.process_figures()
    assert figures is not None
    assert figures.cpu_seconds > 0
    assert figures.resident_bytes is not None
    assert figures.resident_bytes > 10_000_000


def test_a_ps1_hook_runs_with_powershell_on_either_system() -> None:
    hook = Hook(command=("C:/hooks/Drain-AppPool.PS1", "DefaultAppPool"))
    expected = [
        "-NoProfile",
        "-NonInteractive",
        "-ExecutionPolicy",
        "Bypass",
        "-File",
        "C:/hooks/Drain-AppPool.PS1",
        "DefaultAppPool",
    ]
    assert hooks.command_line(hook, Windows(RecordingWin32())) == ["powershell.exe", *expected]
    here = "powershell.exe" if platform.is_windows() else "pwsh"  # PowerShell 7 off Windows
    assert hooks.command_line(hook) == [here, *expected]
    assert hooks.command_line(Hook(command=("drain", "--now"))) == ["drain", "--now"]


# -- Windows, through the seam ------------------------------------------------------------


@dataclass
class RecordingWin32:
    """Stands in for pywin32 (`bridge.infra.platform.windows.Win32`); records every call."""

    working_set: int | None = 123_456_789
    jobs: bool = True  # False: as without pywin32
    locked: bool = False
    calls: list[tuple[str, object]] = field(default_factory=list)
    console_callback: Callable[[str], None] | None = None

    def on_console_stop(self, callback: Callable[[str], None]) -> None:
        self.calls.append(("on_console_stop", None))
        self.console_callback = callback

    def create_job(self, pid: int) -> object | None:
        self.calls.append(("create_job", pid))
        return f"job-of-{pid}" if self.jobs else None

    def jobs_available(self) -> bool:
        return self.jobs

    def ctrl_break(self, pid: int) -> None:
        self.calls.append(("ctrl_break", pid))

    def terminate_job(self, job: object) -> None:
        self.calls.append(("terminate_job", job))

    def close_job(self, job: object) -> None:
        self.calls.append(("close_job", job))

    def taskkill(self, pid: int) -> None:
        self.calls.append(("taskkill", pid))

    def lock(self, fd: int) -> bool:
        self.calls.append(("lock", fd))
        if self.locked:
            return False
        self.locked = True
        return True

    def working_set_bytes(self) -> int | None:
        return self.working_set


def test_windows_hook_gets_its_own_console_group_and_job_object() -> None:
    api = RecordingWin32()
    system = Windows(api)
    assert system.spawn_options() == {"creationflags": CREATE_NEW_PROCESS_GROUP}
    assert getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", CREATE_NEW_PROCESS_GROUP) == 0x200
    tree = system.contain(4242)
    assert api.calls == [("create_job", 4242)]
    tree.terminate()
    tree.kill()
    assert api.calls[1:] == [("ctrl_break", 4242), ("terminate_job", "job-of-4242")]
    tree.close()
    tree.close()
    assert api.calls.count(("close_job", "job-of-4242")) == 1
    assert ("taskkill", 4242) not in api.calls


def test_windows_hook_without_a_job_object_is_killed_by_taskkill() -> None:
    api = RecordingWin32(jobs=False)
    tree = Windows(api).contain(4242)
    tree.kill()
    tree.close()
    assert api.calls == [("create_job", 4242), ("taskkill", 4242)]


async def test_windows_ctrl_break_from_the_signal_handler_stops_on_the_loop() -> None:
    api = RecordingWin32()
    stopped: list[str] = []
    loop = asyncio.get_running_loop()
    Windows(api).install_stop_handlers(loop, stopped.append, lambda: None)
    assert api.console_callback is not None
    # Python runs signal handlers between bytecodes, outside the loop: a thread stands in.
    handler = threading.Thread(target=api.console_callback, args=("Ctrl+Break",))
    handler.start()
    handler.join()
    await eventually(lambda: stopped == ["Ctrl+Break"])


def test_windows_defaults_live_under_programdata() -> None:
    system = Windows(RecordingWin32())
    environ = {"ProgramData": "D:\\ProgramData"}
    base = PureWindowsPath("D:\\ProgramData\\maintenance-bridge")
    assert PureWindowsPath(system.default_state_dir(environ)) == base / "state"
    assert PureWindowsPath(system.default_config_file(environ)) == base / "config.toml"
    assert PureWindowsPath(system.default_log_file(environ)) == base / "logs" / "bridge.jsonl"
    fallback = PureWindowsPath(system.default_state_dir({}))
    assert fallback == PureWindowsPath("C:\\ProgramData\\maintenance-bridge\\state")


def test_windows_lock_goes_through_the_seam_and_fsync_of_a_directory_is_a_no_op(
    tmp_path: Path,
) -> None:
    api = RecordingWin32()
    system = Windows(api)
    assert system.lock(7)
    assert not system.lock(8)
    assert api.calls == [("lock", 7), ("lock", 8)]
    system.fsync_directory(tmp_path)


def test_metrics_leave_out_what_the_platform_does_not_know(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def render(api: RecordingWin32) -> str:
        monkeypatch.setattr(platform, "current", lambda: Windows(api))
        out = Exposition()
        metrics._process(out)
        return out.text()

    with_pywin32 = render(RecordingWin32())
    assert "\nprocess_resident_memory_bytes 123456789" in with_pywin32
    without = render(RecordingWin32(working_set=None))
    assert "\nprocess_cpu_seconds_total " in without
    assert "resident_memory" not in without


# -- the Windows service, through its seam ------------------------------------------------


@dataclass
class RecordingServices:
    """Stands in for the Service Control Manager (`platform.services.ServiceManager`)."""

    state: str = "not installed"
    calls: list[tuple[str, object]] = field(default_factory=list)

    def install(self, spec: ServiceRegistration) -> None:
        self.calls.append(("install", spec))
        self.state = "stopped"

    def remove(self, name: str) -> None:
        self.calls.append(("remove", name))
        self.state = "not installed"

    def start(self, name: str) -> None:
        self.calls.append(("start", name))
        self.state = "running"

    def stop(self, name: str) -> None:
        self.calls.append(("stop", name))
        self.state = "stopped"

    def status(self, name: str) -> str:
        return self.state


def test_service_install_registers_the_class_options_and_recovery(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    manager = RecordingServices()
    spec = service.ServiceSpec(config, event_log=True)
    code, message = service.control("install", manager, spec)
    assert (code, manager.calls) == (2, [])
    assert f"no configuration at {config}" in message
    config.write_text("")
    assert service.control("install", manager, spec)[0] == 0
    ((_, installed),) = manager.calls
    assert isinstance(installed, service.ServiceSpec)
    assert installed.python_class == "bridge.app.winservice.BridgeService"
    assert installed.options == {"config": str(config), "event_log": "1"}
    assert installed.restart_delays_ms == (5_000, 5_000, 30_000)


def test_service_start_status_stop_uninstall() -> None:
    manager = RecordingServices(state="stopped")
    spec = service.ServiceSpec(Path("config.toml"))
    assert service.control("status", manager, spec) == (3, "maintenance-bridge: stopped")
    assert service.control("start", manager, spec)[0] == 0
    assert service.control("status", manager, spec) == (0, "maintenance-bridge: running")
    assert service.control("uninstall", manager, spec)[0] == 0
    assert [call for call, _ in manager.calls] == ["start", "stop", "remove"]
    assert service.control("uninstall", manager, spec) == (
        0,
        "service maintenance-bridge is not installed",
    )
    assert len(manager.calls) == 3


@pytest.mark.posix
def test_service_command_off_windows_says_where_to_look() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bridge", "service", "status"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 1
    assert "Windows only; on Linux run the bridge under systemd" in result.stderr


async def test_a_service_stop_request_ends_the_real_bridge(tmp_path: Path) -> None:
    """What `BridgeService` does, minus pywin32: the bridge runs in the service's thread
    (no signal handlers there) and the control handler's stop request ends it cleanly."""
    out = tmp_path / "events.jsonl"  # where azure_file_config sends the events
    async with Simulator(provider="azure") as sim:
        sim.faults.set(provider="azure", rate_limit=False)
        config = azure_file_config(tmp_path, sim)
        stop = service.StopRequest()
        running = asyncio.create_task(asyncio.to_thread(service.run_service, config, stop))
        sim.azure.add_event(event_type="Freeze", duration=5)
        await eventually(lambda: out.exists() and out.read_text().strip(), timeout=30)
        threading.Thread(target=stop.request).start()
        assert await asyncio.wait_for(running, 30) == 0
    (event,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert event["data"]["kind"] == "freeze"


def test_a_stop_requested_before_the_loop_runs_is_not_lost(tmp_path: Path) -> None:
    stop = service.StopRequest()
    stop.request()
    config = tmp_path / "config.toml"
    config.write_text(
        f'[source]\nprovider = "azure"\n[source.azure]\nimds_url = "http://127.0.0.1:9/"\n'
        f'[state]\ndir = "{tmp_path / "state"}"\n[listener]\nenabled = false\n'
    )
    assert service.run_service(config, stop) == 0


def test_a_service_with_a_bad_configuration_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[delivery]\nshutdown_timeout = -1\n")
    assert service.run_service(config, service.StopRequest()) == 2


def test_the_service_host_is_handed_the_bridge_and_its_log(tmp_path: Path) -> None:
    """What the platform's service host calls (`ServiceProgram`): `run` with the configured
    file and the service's log file, where a configuration error is told (exit status 2,
    which the host does not restart)."""
    config = tmp_path / "config.toml"
    config.write_text("[delivery]\nshutdown_timeout = -1\n")
    log_file = tmp_path / "logs" / "maintenance-bridge.log"
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    program: ServiceProgram = service.BridgeProgram()
    try:
        assert program.run(config, log_file, None) == 2
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:], root.level = handlers, level
    (line,) = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert line["level"] == "error"
    assert "shutdown_timeout" in line["message"]


@pytest.mark.posix
def test_the_service_host_off_windows_says_where_to_look() -> None:
    with pytest.raises(RuntimeError, match="Windows only; on Linux run the bridge under systemd"):
        platform.service_host("name", "display", "description", service.BridgeProgram)


def test_the_windows_deployment_agrees_with_the_bridge() -> None:
    """deploy/windows/: its configuration loads, its hooks are the shipped scripts run with
    PowerShell, and the install script uses only options `service install` has."""
    windows = ROOT / "deploy" / "windows"
    config, _ = load_config(windows / "config.toml")
    system = Windows(RecordingWin32())
    for hook in config.hooks:
        line = hooks.command_line(hook, system)
        assert line[:6] == ["powershell.exe", *hooks.POWERSHELL_ARGS]
        assert (windows / "hooks" / PureWindowsPath(hook.command[0]).name).is_file()
    install = (windows / "install.ps1").read_text()
    assert '@("service", "install", "--config", $target)' in install
    help_text = subprocess.run(
        [sys.executable, "-m", "bridge", "service", "install", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        timeout=60,
    ).stdout
    service_lines = [line for line in install.splitlines() if "$install" in line]
    flags = {flag for line in service_lines for flag in re.findall(r'"(--[a-z-]+)"', line)}
    assert flags == {"--config", "--event-log"}
    assert all(flag in help_text for flag in flags)
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "windows.yml").read_text())
    assert set(workflow["jobs"]) == {"test", "service"}
    smoke = "\n".join(step.get("run", "") for step in workflow["jobs"]["service"]["steps"])
    for action in ("install --config", "start", "status", "stop", "uninstall"):
        assert f"python -m bridge service {action}" in smoke


def test_an_unusable_state_dir_is_one_clear_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(statelock.StateDirError) as refused, statelock.holding(blocker / "state"):
        pass
    assert str(refused.value).startswith(f"cannot use the state directory {blocker / 'state'}: ")


def test_output_is_utf8_whatever_the_code_page(tmp_path: Path) -> None:
    """Redirected on Windows, stdout would use the ANSI code page (cp1252 here), in which the
    doctor's table (an arrow) and non-ASCII event fields cannot be written."""
    with SimulatorThread(provider="azure") as sim:
        sim.faults.set(provider="azure", rate_limit=False)
        config = azure_file_config(tmp_path, sim)
        result = subprocess.run(
            [sys.executable, "-m", "bridge", "doctor", "--config", str(config)],
            capture_output=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONIOENCODING": "cp1252"},
            timeout=60,
        )
    assert result.returncode == 0, result.stderr
    assert "\N{RIGHTWARDS ARROW} source /subscriptions/" in result.stdout.decode("utf-8")
