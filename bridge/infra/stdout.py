"""Standard output of the commands: UTF-8 wherever it goes, and a reader that may leave early.

`maintenance-bridge fleet export | head -1` closes the pipe after one line. Python ignores
SIGPIPE, so the next write raises BrokenPipeError wherever it happens (in a command, in a
sink, or when the interpreter flushes stdout at exit) and a traceback ends a perfectly
normal pipeline. `exits_quietly_when_output_closes` wraps the whole command line, so every
command, the fleet's included, ends quietly with the status a shell reports for a program
stopped by SIGPIPE, as `seq 1 1000000 | head -1` does.

Windows says it differently: a write into a pipe whose reader is gone fails with
`OSError: [Errno 22] Invalid argument` (EINVAL), not BrokenPipeError. `output_closed` treats
both as the closed pipe they are.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Callable
from typing import Final

from bridge.infra.platform import is_windows

#: 128 + SIGPIPE (13): what a shell reports for a writer whose reader went away.
EXIT_OUTPUT_CLOSED: Final = 141


def utf8_stdout() -> None:
    """JSON lines and tables in UTF-8 wherever stdout goes: redirected on Windows it would
    be the ANSI code page, which cannot encode every character (and `doctor` prints a →)."""
    encoding = (getattr(sys.stdout, "encoding", None) or "utf-8").lower().replace("-", "")
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if encoding != "utf8" and reconfigure is not None:
        reconfigure(encoding="utf-8")


def output_closed(exc: OSError) -> bool:
    """Whether a failed write means that the reader of the output went away: EPIPE
    (BrokenPipeError) anywhere, EINVAL on Windows, where a closed pipe reports that."""
    if isinstance(exc, BrokenPipeError):
        return True
    return is_windows() and exc.errno == errno.EINVAL


def _stdout_is_a_pipe() -> bool:
    """Whether stdout is a pipe or a socket: only then can its reader have gone away."""
    try:
        mode = os.fstat(sys.stdout.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _discard_stdout() -> None:
    """Point stdout at the null device, so that the interpreter's last flush (of what is
    still buffered) has somewhere to go instead of printing one more BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def exits_quietly_when_output_closes(command: Callable[[], int]) -> int:
    """Run `command` (a whole command line); its status, or `EXIT_OUTPUT_CLOSED` without a
    traceback when its stdout was closed by the reader.

    A closed-pipe error (`output_closed`) while stdout is not a pipe came from somewhere else
    (a socket): that is a bug to see, so it is raised as it was, like any other OSError.
    """
    try:
        try:
            return command()
        finally:
            if sys.stdout is not None:  # None under pythonw (no console)
                sys.stdout.flush()  # what is still buffered fails here, not at the exit
    except OSError as exc:
        if not output_closed(exc) or not _stdout_is_a_pipe():
            raise
        _discard_stdout()
        return EXIT_OUTPUT_CLOSED
