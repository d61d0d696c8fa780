"""Every difference between POSIX and Windows, behind one interface (`base.Platform`).

`current()` is the implementation for the system the bridge runs on; nothing outside this
package branches on `sys.platform` or imports a POSIX-only module (tests/test_platform.py
walks the sources to keep it so).
"""

from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING, Final

from bridge.infra.platform.base import Platform, ProcessFigures, ProcessTree, StopRequest

if TYPE_CHECKING:
    from bridge.service import ServiceManager

__all__ = [
    "O_BINARY",
    "Platform",
    "ProcessFigures",
    "ProcessTree",
    "StopRequest",
    "current",
    "is_windows",
    "service_manager",
]

#: For `os.open`: the bytes as written. Windows opens in text mode by default (LF -> CRLF).
O_BINARY: Final = int(getattr(os, "O_BINARY", 0))


def is_windows() -> bool:
    return sys.platform == "win32"


def name() -> str:
    """The platform as Python names it (`linux`, `win32`, `darwin`): what `--version` shows."""
    return sys.platform


@functools.cache
def current() -> Platform:
    if sys.platform != "win32":
        from bridge.infra.platform.posix import Posix

        return Posix()
    from bridge.infra.platform.windows import Windows

    return Windows()


def service_manager() -> ServiceManager:
    """The Windows Service Control Manager (pywin32).

    Raises `RuntimeError` with what to do where there is none (not Windows, no pywin32).
    """
    if sys.platform == "win32":
        try:
            from bridge.infra.platform.winservice import PyWin32Services
        except ImportError as exc:
            raise RuntimeError(
                f"pywin32 is missing ({exc}): pip install 'maintenance-bridge[windows]'"
            ) from exc
        return PyWin32Services()
    raise RuntimeError("Windows only; on Linux run the bridge under systemd (deploy/systemd)")
