"""The POSIX holder of a command that must not outlive the process that started it.

`python -I watchdog.py COMMAND [ARG ...]` (what `Posix.held` returns) runs COMMAND as its child, in
its own process group (the watchdog's, made by the parent with `start_new_session`), and:

- when its parent dies, however it dies (kill -9, the OOM killer), kills COMMAND and
  everything it started at once (SIGKILL), then itself;
- when COMMAND exits, kills what it left running and exits with COMMAND's status.

Why a watchdog process rather than the alternatives: a parent-death signal
(`PR_SET_PDEATHSIG`) reaches only the direct child, and COMMAND runs in a group of its own,
so something must turn "my parent died" into "kill the whole tree", and it must be a process
that outlives the parent, i.e. a child of it. A cgroup would hold the tree best but needs a
delegated cgroup (systemd) that a plain `elect` on any VM does not have. A subreaper alone
does not notice its parent's death. So the watchdog is the command's parent, receives the
parent-death signal (Linux, through prctl by ctypes), also polls `getppid()` (every system,
and the moment between fork and prctl), and is a child subreaper (Linux) so that a
grandchild that daemonizes into a session of its own is re-parented to it and still found:
the kill walks every descendant from /proc, then the process group.

What it cannot hold: a descendant that escapes both the group and the ancestry (a double
fork outside Linux, where there is no subreaper), or a process handed to another service
(systemd-run, at, a container runtime).

Standard library only, and nothing of `bridge` imported (it is run as a file): it starts in
about 20 ms.
SIGTERM, SIGINT and SIGHUP are left to COMMAND: the parent signals the whole group, and the
watchdog waits for COMMAND to act on it.
"""

# The platform assertion must precede the POSIX-only code for mypy --platform win32 to skip
# this module, hence imports below a statement:
# ruff: noqa: E402
from __future__ import annotations

import sys

assert sys.platform != "win32"  # mypy: the rest of this module is POSIX-only

import contextlib
import ctypes
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Final

#: prctl options (linux/prctl.h).
PR_SET_PDEATHSIG: Final = 1
PR_SET_CHILD_SUBREAPER: Final = 36
#: The parent-death signal; acted on only if the parent is really gone (getppid changed).
PARENT_DIED: Final = signal.SIGUSR2
#: Seconds between two `getppid()` polls (the fallback where there is no prctl).
POLL: Final = 0.1


def _prctl(option: int, value: int) -> bool:
    """prctl(2) through ctypes; False where there is none (not Linux) or it refused."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """Every live descendant of `root`, from /proc (empty where there is no /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # comm (field 2) may hold spaces and parentheses: fields follow the last ')'.
            fields = entry.read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def kill_descendants() -> None:
    """SIGKILL every descendant of this process, until none is left (one may fork meanwhile)."""
    for _ in range(100):
        found = descendants(os.getpid())
        if not found:
            return
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        reap()


def reap() -> None:
    """Collect every exited child (orphans are re-parented here: we are a subreaper)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def kill_everything() -> None:
    """The parent is gone: the whole tree, then the group (this process with it)."""
    kill_descendants()
    os.killpg(os.getpgrp(), signal.SIGKILL)


def run(command: Sequence[str]) -> int:
    parent = os.getppid()
    _prctl(PR_SET_CHILD_SUBREAPER, 1)

    def parent_died(_signum: int, _frame: FrameType | None) -> None:
        if os.getppid() != parent:
            kill_everything()

    def leave_to_the_command(_signum: int, _frame: FrameType | None) -> None:
        """The group got it too: COMMAND decides. (A Python handler, not SIG_IGN, which
        the command would inherit.)"""

    signal.signal(PARENT_DIED, parent_died)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, leave_to_the_command)
    _prctl(PR_SET_PDEATHSIG, PARENT_DIED)
    if os.getppid() != parent:  # died before prctl took effect
        kill_everything()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL)
        kill_everything()

    threading.Thread(target=watch, name="watchdog:parent", daemon=True).start()
    try:
        pid = os.posix_spawnp(command[0], list(command), os.environ)
    except OSError as exc:
        print(f"watchdog: cannot start {command[0]}: {exc}", file=sys.stderr)
        return 127
    while True:
        done, status = os.waitpid(-1, 0)  # orphans re-parented here are reaped too
        if done == pid:
            break
    kill_descendants()
    return os.waitstatus_to_exitcode(status)


def main(argv: Sequence[str]) -> int:
    if not argv:
        print("usage: python -I watchdog.py COMMAND [ARG ...]", file=sys.stderr)
        return 2
    code = run(argv)
    if code < 0:  # killed by a signal: die of the same one, so the parent sees what happened
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have no handler
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
