"""Process limits and file ownership: POSIX calls with what Windows does instead, here in the
platform layer like every other difference between the two (tests/test_platform.py).

The fleet service raises its open-file limit at start (1,024 by default on Linux, fewer than
the sidecars of a fleet hold open), and `fleet restore` run as root hands the restored store
to its directory's owner. Tests set the limits of a child process to stand in for a full
disk or a low file limit.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Final

#: Open files assumed where the system has no such limit (Windows: the C runtime's table).
WINDOWS_FILES: Final = 8192


def file_limit() -> tuple[int | None, int | None]:
    """(soft, hard) open-file limits; None for unlimited (and for both on Windows)."""
    if sys.platform == "win32":
        return None, None
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def value(n: int) -> int | None:
        return None if n == resource.RLIM_INFINITY else int(n)

    return value(soft), value(hard)


def set_file_limit(soft: int, hard: int | None = None) -> None:
    """Set the open-file limits (hard: unchanged when None). POSIX only; no-op on Windows."""
    if sys.platform == "win32":
        return
    import resource

    current_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, current_hard if hard is None else hard))


def raise_file_limit(fallback: int) -> tuple[int, str | None]:
    """Raise the soft open-file limit to the hard one where allowed (to 65,536 when the hard
    one is unlimited): (the soft limit now, or `fallback` when unlimited; why it could not
    be raised, or None)."""
    if sys.platform == "win32":
        return WINDOWS_FILES, None
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    problem = None
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:
            problem = f"cannot raise the open-file limit from {soft}: {exc}"
    return (int(soft) if soft != resource.RLIM_INFINITY else fallback), problem


def set_file_size_limit(size: int) -> None:
    """Cap every file this process writes at `size` bytes (a write past it fails as on a full
    disk; Python ignores SIGXFSZ). POSIX only; no-op on Windows."""
    if sys.platform == "win32":
        return
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


def own_like_directory(path: Path) -> None:
    """Give `path` to its directory's owner when root made it (the service's user under
    systemd's StateDirectory or a container's volume); nothing otherwise, nor on Windows."""
    if sys.platform == "win32" or os.geteuid() != 0:
        return
    directory = path.parent.stat()
    os.chown(path, directory.st_uid, directory.st_gid)
