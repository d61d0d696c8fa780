"""Every difference between POSIX and Windows, behind one interface (`base.Platform`).

`current()` is the implementation for the system the bridge runs on; nothing outside this
package branches on `sys.platform` or imports a POSIX-only module (tests/test_platform.py
walks the sources to keep it so).
"""

from __future__ import annotations

import functools
import sys

from bridge.platform.base import Platform, ProcessFigures, ProcessTree, StopRequest

__all__ = ["Platform", "ProcessFigures", "ProcessTree", "StopRequest", "current", "is_windows"]


def is_windows() -> bool:
    return sys.platform == "win32"


@functools.cache
def current() -> Platform:
    if sys.platform != "win32":
        from bridge.platform.posix import Posix

        return Posix()
    from bridge.platform.windows import Windows

    return Windows()
