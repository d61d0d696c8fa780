"""The POSIX side of `bridge.infra.platform` (Linux, macOS): signals, sessions, flock, getrusage.

A hook is started in a new session, so its pid is the id of a process group that holds
every process it starts (unless one makes a session of its own, as a daemon does): `killpg`
ends the tree. The lock is `flock`, which the kernel releases when the process dies, so a
crash never leaves a stale lock behind.
"""

# The platform assertion must precede the POSIX-only imports for mypy --platform win32 to
# skip this module, hence imports below a statement:
# ruff: noqa: E402
from __future__ import annotations

import sys

assert sys.platform != "win32"  # mypy: the rest of this module is POSIX-only

import asyncio
import contextlib
import fcntl
import os
import resource
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bridge.infra.platform.base import Hangup, ProcessFigures, StopRequest

_PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE")


@dataclass
class ProcessGroup:
    """A hook's process group: its leader's pid is the group id."""

    pgid: int

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def close(self) -> None:
        pass


class Posix:
    name = "posix"

    def install_stop_handlers(
        self, loop: asyncio.AbstractEventLoop, on_stop: StopRequest, on_hangup: Hangup
    ) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_stop, sig.name)
        loop.add_signal_handler(signal.SIGHUP, on_hangup)

    def spawn_options(self) -> dict[str, Any]:
        return {"start_new_session": True}

    def contain(self, pid: int) -> ProcessGroup:
        return ProcessGroup(pid)

    def held(self, command: Sequence[str]) -> list[str]:
        # Run as a file, isolated (-I: no script directory, user site or PYTHON* variables
        # in its own path): nothing of `bridge` is imported, so no asyncio either: it starts
        # in ~20 ms and stays small for as long as the command runs.
        return [sys.executable, "-I", str(Path(__file__).with_name("watchdog.py")), *command]

    def powershell(self) -> str:
        return "pwsh"  # PowerShell 7 is the one that runs on Linux and macOS

    def default_state_dir(self, environ: Mapping[str, str] | None = None) -> Path:
        return Path("/var/lib/maintenance-bridge")

    def default_config_file(self, environ: Mapping[str, str] | None = None) -> Path:
        return Path("/etc/maintenance-bridge/config.toml")

    def lock(self, fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def fsync_directory(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def process_figures(self) -> ProcessFigures:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return ProcessFigures(usage.ru_utime + usage.ru_stime, _resident_bytes(usage.ru_maxrss))


def _resident_bytes(peak: int) -> float:
    """Current RSS from /proc on Linux; the peak from getrusage elsewhere (macOS: bytes)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return float(int(statm.read().split()[1]) * _PAGE_SIZE)
    except (OSError, ValueError, IndexError):
        return float(peak if sys.platform == "darwin" else peak * 1024)
