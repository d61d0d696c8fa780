"""Which process listens on a TCP port, when the system lets us know.

`doctor` finds the listener's port taken and should say by whom: "a bridge is already
running here" is only true when a bridge answers, and otherwise the user needs the program
to stop or move. On Linux, /proc/net/tcp{,6} maps a listening port to a socket inode and
/proc/<pid>/fd maps inodes to processes (other users' processes only for root). Elsewhere,
or without the rights, the answer is None and the caller says it cannot be told.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

PROC: Final = Path("/proc")
_LISTEN: Final = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


@dataclass(frozen=True, slots=True)
class Holder:
    pid: int
    name: str
    command: str

    def __str__(self) -> str:
        shown = self.command if len(self.command) <= 120 else self.command[:117] + "..."
        return (
            f"pid {self.pid} ({self.name}: {shown})" if shown else f"pid {self.pid} ({self.name})"
        )


def _listening_inodes(port: int, proc: Path) -> set[int]:
    """The socket inodes listening on `port` (IPv4 and IPv6) in this network namespace."""
    inodes: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            local_port = fields[1].rsplit(":", 1)[-1]
            if int(local_port, 16) == port and fields[9].isdigit():
                inodes.add(int(fields[9]))
    inodes.discard(0)
    return inodes


def _describe(pid_dir: Path) -> Holder:
    def read(name: str) -> str:
        try:
            return (pid_dir / name).read_bytes().decode(errors="replace")
        except OSError:
            return ""

    command = " ".join(read("cmdline").split("\0")).strip()
    return Holder(int(pid_dir.name), read("comm").strip() or "?", command)


def listening_process(port: int, proc: Path = PROC) -> Holder | None:
    """The process listening on `port`, or None when it cannot be told (see the module)."""
    inodes = _listening_inodes(port, proc)
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    try:
        pid_dirs = [entry for entry in proc.iterdir() if entry.name.isdigit()]
    except OSError:
        return None
    for pid_dir in pid_dirs:
        try:
            fds = list((pid_dir / "fd").iterdir())
        except OSError:  # gone meanwhile, or another user's (not root)
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target in wanted:
                return _describe(pid_dir)
    return None
