"""The one interface behind which the operating systems differ.

Everything the bridge does differently on POSIX and on Windows is a method of `Platform`:
how a stop is requested (signals, console events, a service stop request), how a hook's
process tree is contained and killed, where state and configuration live by default, how a
file is locked, whether a directory can be fsynced, and where the process figures of
`/metrics` come from. `bridge.infra.platform.current()` returns the implementation for the running
system; the rest of the code calls it and never looks at `sys.platform` itself, so a
POSIX-only call cannot hide on a Windows path (`mypy --platform win32` checks that).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

#: Called with the name of what asked for the stop ("SIGTERM", "Ctrl+Break", ...).
StopRequest = Callable[[str], None]
#: Called on a hang-up (POSIX SIGHUP; Windows has no such signal).
Hangup = Callable[[], None]


@dataclass(frozen=True, slots=True)
class ProcessFigures:
    """What `/metrics` reports about the bridge's own process; None where unknown."""

    cpu_seconds: float
    resident_bytes: float | None


class ProcessTree(Protocol):
    """A hook's process and everything it started, to be ended as one."""

    def terminate(self) -> None:
        """Ask the whole tree to exit (SIGTERM to the group, Ctrl+Break to the console group)."""

    def kill(self) -> None:
        """End the whole tree at once (SIGKILL to the group, TerminateJobObject)."""

    def close(self) -> None:
        """Release what was held to reach the tree (the Job Object's handle)."""


class Platform(Protocol):
    """See the module docstring; `posix.Posix` and `windows.Windows` implement it."""

    name: str

    def install_stop_handlers(
        self, loop: asyncio.AbstractEventLoop, on_stop: StopRequest, on_hangup: Hangup
    ) -> None:
        """Call `on_stop` (on the loop) when the user or the service manager asks to stop,
        and `on_hangup` on a hang-up (POSIX SIGHUP; Windows has none)."""

    def spawn_options(self) -> dict[str, Any]:
        """Keyword arguments for `create_subprocess_exec` that put a hook in its own group."""

    def contain(self, pid: int) -> ProcessTree:
        """The tree of the hook just started as `pid` (with `spawn_options`)."""

    def held(self, command: Sequence[str]) -> list[str]:
        """The command line that runs `command` so that it, and everything it starts, ends
        when this process ends, however it ends (started with `spawn_options`, then
        `contain`ed). POSIX: behind a watchdog (`watchdog.py`); Windows: as is, its Job
        Object kills on close. Raises `RuntimeError` saying why where it cannot be held."""

    def powershell(self) -> str:
        """The PowerShell executable that runs `.ps1` hooks."""

    def default_state_dir(self, environ: Mapping[str, str] | None = None) -> Path:
        """Where the spool lives when `state.dir` is not set."""

    def default_config_file(self, environ: Mapping[str, str] | None = None) -> Path:
        """The configuration file a service installation reads."""

    def lock(self, fd: int) -> bool:
        """Take an exclusive lock on the open file `fd` without waiting; False if held.

        The lock ends when the file is closed or the process ends, however it ends."""

    def fsync_directory(self, path: Path) -> None:
        """Make a new entry in directory `path` durable (where the system allows it)."""

    def process_figures(self) -> ProcessFigures | None:
        """CPU time and resident memory of this process, or None if not available."""
