"""One bridge per state directory: an exclusive lock held for the life of the process.

Two bridges on one spool both deliver every event, run every hook and send every approval:
each is right on its own, and together they double everything. So the commands that act on
the spool (`run`, and `demo` on its own directory) lock `<state.dir>/bridge.lock` first and
keep it until they exit; a second one fails at once with one line naming the directory and
the holder's pid. The lock is the operating system's (flock, or an msvcrt byte lock), which
ends with the process however it ends, so a crash never leaves a stale lock to clean up.

`spool list|replay|purge` do not take it: they are meant to be used beside a live bridge
(SQLite serializes their transactions with the bridge's). `once` and `doctor` do not write
the state directory.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from bridge.infra import platform

LOCK_NAME: Final = "bridge.lock"
#: The pid is written padded to this width, so a shorter pid overwrites a longer one whole.
_PID_WIDTH: Final = 32


class StateDirError(Exception):
    """The state directory cannot be locked: in use, or not usable at all."""


class StateDirInUse(StateDirError):
    """Another process holds the state directory's lock."""

    def __init__(self, directory: Path, holder: int | None) -> None:
        self.directory = directory
        self.holder = holder
        who = f"pid {holder}" if holder else "a process that has not written its pid yet"
        super().__init__(
            f"state directory {directory} is in use by another bridge ({who}); "
            "one bridge per state.dir, or every event would be delivered twice"
        )


def _read_holder(fd: int) -> int | None:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, _PID_WIDTH).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def _ensure(directory: Path) -> None:
    """Create the state directory; make a new one durable (the spool's fsyncs need it)."""
    if directory.is_dir():
        return
    directory.mkdir(parents=True, exist_ok=True)
    platform.current().fsync_directory(directory.parent)


@contextlib.contextmanager
def holding(directory: Path) -> Iterator[Path]:
    """Hold the lock of `directory` (created if missing) for the `with` block.

    Raises `StateDirInUse` at once when another process holds it, `StateDirError` when the
    directory cannot be created or the lock file opened.
    """
    path = directory / LOCK_NAME
    try:
        _ensure(directory)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | platform.O_BINARY, 0o644)
    except OSError as exc:
        raise StateDirError(
            f"cannot use the state directory {directory}: {exc.strerror or exc} "
            "(create it for the bridge's user, or set state.dir)"
        ) from exc
    try:
        if not platform.current().lock(fd):
            raise StateDirInUse(directory, _read_holder(fd))
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, str(os.getpid()).ljust(_PID_WIDTH - 1).encode("ascii") + b"\n")
        yield path
    finally:
        os.close(fd)
