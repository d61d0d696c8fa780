"""The Windows side of `bridge.infra.platform`: console events, Job Objects, msvcrt locks.

A hook is started with `CREATE_NEW_PROCESS_GROUP` (so Ctrl+Break can be sent to it alone)
and assigned to a Job Object of its own with `KILL_ON_JOB_CLOSE`: `TerminateJobObject` ends
every process it started, as `killpg` does on Linux, and the job dies with the bridge. The
one window: a process the hook starts before it is assigned (microseconds after its start)
is outside the job. Without pywin32 (the `[windows]` extra), or when the job cannot be made,
hooks still run and are killed with `taskkill /T /F` (by parent links), and `/metrics`
leaves the resident memory out.

Every Windows call goes through `Win32`, a thin seam: `PyWin32` makes the real calls, and
the tests (which run on Linux) pass a recorder to check which calls are made, and when. This
module imports on any system; only `PyWin32`'s methods need Windows.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol, cast

from bridge.infra.platform.base import Hangup, ProcessFigures, StopRequest

#: `subprocess.CREATE_NEW_PROCESS_GROUP` (defined only on Windows): the child leads a new
#: console process group, the target of Ctrl+Break.
CREATE_NEW_PROCESS_GROUP: Final = 0x00000200
#: The byte of the lock file that is locked. msvcrt locks are mandatory, so it lies past
#: the pid written at the start of the file, which must stay readable to a second instance.
LOCK_OFFSET: Final = 1 << 20
PROGRAM_DATA_DEFAULT: Final = r"C:\ProgramData"


class Win32(Protocol):
    """The Windows calls the bridge makes (see the module docstring)."""

    def on_console_stop(self, callback: Callable[[str], None]) -> None:
        """Call `callback(name)` on Ctrl+C and Ctrl+Break (from the signal handler)."""

    def create_job(self, pid: int) -> object | None:
        """A Job Object (kill on close) holding process `pid`; None without pywin32."""

    def jobs_available(self) -> bool:
        """Whether Job Objects can be made (pywin32 is installed)."""

    def ctrl_break(self, pid: int) -> None:
        """Send Ctrl+Break to the console process group `pid`."""

    def terminate_job(self, job: object) -> None: ...

    def close_job(self, job: object) -> None: ...

    def taskkill(self, pid: int) -> None:
        """`taskkill /T /F /PID pid`: the tree, by parent links."""

    def lock(self, fd: int) -> bool: ...

    def working_set_bytes(self) -> int | None: ...


@dataclass
class JobTree:
    """A hook's process tree: its console group for Ctrl+Break, its Job Object to kill."""

    api: Win32
    pid: int
    job: object | None

    def terminate(self) -> None:
        self.api.ctrl_break(self.pid)

    def kill(self) -> None:
        if self.job is not None:
            self.api.terminate_job(self.job)
        else:  # by parent links, while our handle keeps the pid from being reused
            self.api.taskkill(self.pid)

    def close(self) -> None:
        if self.job is not None:
            self.api.close_job(self.job)
            self.job = None


@dataclass
class Windows:
    api: Win32 = field(default_factory=lambda: PyWin32())
    name: str = "windows"

    def install_stop_handlers(
        self, loop: asyncio.AbstractEventLoop, on_stop: StopRequest, on_hangup: Hangup
    ) -> None:
        def requested(name: str) -> None:
            # A signal handler runs between two bytecodes of the main thread, outside the loop.
            loop.call_soon_threadsafe(on_stop, name)

        self.api.on_console_stop(requested)

    def spawn_options(self) -> dict[str, Any]:
        return {"creationflags": CREATE_NEW_PROCESS_GROUP}

    def contain(self, pid: int) -> JobTree:
        return JobTree(self.api, pid, self.api.create_job(pid))

    def held(self, command: Sequence[str]) -> list[str]:
        """`command` as is: `contain` puts it in a Job Object with kill-on-close whose only
        handle is this process's (not inherited), so when this process ends, however it
        ends, the system closes the handle and kills every process of the job."""
        if not self.api.jobs_available():
            raise RuntimeError(
                "a command that must end with this process needs a Job Object: "
                "pip install 'maintenance-bridge[windows]' (pywin32)"
            )
        return list(command)

    def powershell(self) -> str:
        return "powershell.exe"  # Windows PowerShell 5.1, part of every Windows Server

    def _base(self, environ: Mapping[str, str] | None) -> Path:
        environ = os.environ if environ is None else environ
        return Path(environ.get("ProgramData") or PROGRAM_DATA_DEFAULT) / "maintenance-bridge"

    def default_state_dir(self, environ: Mapping[str, str] | None = None) -> Path:
        return self._base(environ) / "state"

    def default_config_file(self, environ: Mapping[str, str] | None = None) -> Path:
        return self._base(environ) / "config.toml"

    def default_log_file(self, environ: Mapping[str, str] | None = None) -> Path:
        """The service's JSON-lines log (rotated)."""
        return self._base(environ) / "logs" / "bridge.jsonl"

    def lock(self, fd: int) -> bool:
        return self.api.lock(fd)

    def fsync_directory(self, path: Path) -> None:
        """Nothing to do: a directory cannot be opened for FlushFileBuffers without backup
        privileges, and NTFS journals its metadata, so a new entry survives a crash."""

    def process_figures(self) -> ProcessFigures:
        times = os.times()  # user and system are the process's own on Windows too
        return ProcessFigures(times.user + times.system, self.api.working_set_bytes())


class PyWin32:
    """The real calls: pywin32 where it is installed, the standard library otherwise."""

    def on_console_stop(self, callback: Callable[[str], None]) -> None:
        if sys.platform == "win32":
            import signal

            names = {signal.SIGINT: "Ctrl+C", signal.SIGBREAK: "Ctrl+Break"}

            def handler(signum: int, _frame: object) -> None:
                callback(names[signal.Signals(signum)])

            for sig in names:
                signal.signal(sig, handler)

    def create_job(self, pid: int) -> object | None:
        if sys.platform == "win32":
            try:
                import win32api
                import win32con
                import win32job
            except ImportError:
                return None
            create: Any = win32job.CreateJobObject  # its stub says it returns None
            try:
                job = create(None, "")
            except win32api.error:
                return None  # no job: the kill falls back to taskkill /T
            kind = win32job.JobObjectExtendedLimitInformation
            access = win32con.PROCESS_SET_QUOTA | win32con.PROCESS_TERMINATE
            try:
                info = win32job.QueryInformationJobObject(job, kind)
                info["BasicLimitInformation"]["LimitFlags"] |= (
                    win32job.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
                )
                win32job.SetInformationJobObject(job, kind, info)
                process = win32api.OpenProcess(access, False, pid)
                try:
                    win32job.AssignProcessToJobObject(job, process)
                finally:
                    win32api.CloseHandle(process)
            except win32api.error:  # it has exited already, or cannot be contained
                self.close_job(job)
                return None
            return cast(object, job)
        return None

    def jobs_available(self) -> bool:
        if sys.platform == "win32":
            try:
                import win32job  # noqa: F401
            except ImportError:
                return False
            return True
        return False

    def ctrl_break(self, pid: int) -> None:
        if sys.platform == "win32":
            import signal

            # Fails without a console (a service has none): the Job Object kill follows.
            with contextlib.suppress(OSError):
                os.kill(pid, signal.CTRL_BREAK_EVENT)

    def terminate_job(self, job: object) -> None:
        if sys.platform == "win32":
            import win32api
            import win32job

            with contextlib.suppress(win32api.error):
                win32job.TerminateJobObject(cast(int, job), 1)

    def close_job(self, job: object) -> None:
        if sys.platform == "win32":
            import win32api

            with contextlib.suppress(win32api.error):
                win32api.CloseHandle(cast(int, job))

    def taskkill(self, pid: int) -> None:
        subprocess.run(
            ["taskkill", "/T", "/F", "/PID", str(pid)],
            capture_output=True,
            check=False,
        )

    def lock(self, fd: int) -> bool:
        if sys.platform == "win32":
            import msvcrt

            os.lseek(fd, LOCK_OFFSET, os.SEEK_SET)
            try:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            except OSError:
                return False
            finally:
                os.lseek(fd, 0, os.SEEK_SET)
            return True
        raise NotImplementedError("msvcrt locks exist on Windows only")

    def working_set_bytes(self) -> int | None:
        if sys.platform == "win32":
            try:
                import win32api
                import win32process
            except ImportError:
                return None
            info = win32process.GetProcessMemoryInfo(win32api.GetCurrentProcess())
            return int(info["WorkingSetSize"])
        return None
