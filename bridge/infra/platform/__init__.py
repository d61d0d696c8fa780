"""Every difference between POSIX and Windows, behind one interface (`base.Platform`).

`current()` is the implementation for the system the bridge runs on; nothing outside this
package branches on `sys.platform` or imports a POSIX-only module (tests/test_platform.py
walks the sources to keep it so).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Final

from bridge.infra.platform.base import Platform, ProcessFigures, ProcessTree, StopRequest
from bridge.infra.platform.services import ServiceManager, ServiceProgram

__all__ = [
    "O_BINARY",
    "Platform",
    "ProcessFigures",
    "ProcessTree",
    "StopRequest",
    "current",
    "is_windows",
    "service_host",
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


def _pywin32_missing(exc: ImportError) -> RuntimeError:
    return RuntimeError(f"pywin32 is missing ({exc}): pip install 'maintenance-bridge[windows]'")


def service_host(
    name: str, display_name: str, description: str, program: Callable[[], ServiceProgram]
) -> type:
    """The class pythonservice.exe hosts as the Windows service `name`, running `program()`:
    the caller (the app) says what to run, the platform layer how (pywin32).

    Raises `RuntimeError` where there is no Windows service (not Windows, no pywin32).
    """
    if sys.platform == "win32":
        try:
            from bridge.infra.platform.winservice import host
        except ImportError as exc:
            raise _pywin32_missing(exc) from exc
        return host(name, display_name, description, program)
    raise RuntimeError("Windows only; on Linux run the bridge under systemd (deploy/systemd)")


def service_manager() -> ServiceManager:
    """The Windows Service Control Manager (pywin32).

    Raises `RuntimeError` with what to do where there is none (not Windows, no pywin32).
    """
    if sys.platform == "win32":
        try:
            from bridge.infra.platform.winservice import PyWin32Services
        except ImportError as exc:
            raise _pywin32_missing(exc) from exc
        return PyWin32Services()
    raise RuntimeError("Windows only; on Linux run the bridge under systemd (deploy/systemd)")
