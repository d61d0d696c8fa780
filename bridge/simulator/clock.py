"""Simulated clock: scenario time that runs ``speed`` times faster than real time.

Scenario steps and Azure auto-transitions are expressed in *simulated* seconds so that the
shipped scenarios can use the vendors' real notice periods (15 min, 60 min, ...) and still play
in seconds under ``--speed``.  Timestamps that clients *read* (``NotBefore``, window times) are
translated to the real wall-clock instant at which, at the current speed, the simulated moment
will occur, so "seconds until NotBefore" computed by a client stays meaningful.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import formatdate


class SimClock:
    """Monotonic simulated time, started at 0 when the scenario (re)starts."""

    def __init__(self, speed: float = 1.0) -> None:
        if speed <= 0:
            raise ValueError("speed must be > 0")
        self.speed = float(speed)
        self._mono0 = time.monotonic()
        self._offset = 0.0
        self._listeners: list[Callable[[], None]] = []

    def now(self) -> float:
        """Current simulated time in seconds since the scenario started."""
        return self._offset + (time.monotonic() - self._mono0) * self.speed

    def reset(self) -> None:
        """Restart simulated time at 0 (used when a scenario is (re)loaded)."""
        self._mono0 = time.monotonic()
        self._offset = 0.0

    def advance(self, seconds: float) -> float:
        """Jump simulated time forward and fire everything that became due, synchronously.

        Synchronous firing lets a test call ``advance`` and immediately observe the result.
        """
        if seconds < 0:
            raise ValueError("the clock only moves forward")
        self._offset += seconds
        for listener in list(self._listeners):
            listener()
        return self.now()

    def on_advance(self, listener: Callable[[], None]) -> None:
        """Register a callback run after every :meth:`advance`."""
        self._listeners.append(listener)

    def real_delay(self, sim_seconds: float) -> float:
        """Real seconds that ``sim_seconds`` of simulated time take at the current speed."""
        return sim_seconds / self.speed

    def wall_time_of(self, sim_time: float) -> float:
        """Epoch seconds at which simulated instant ``sim_time`` happens at the current speed."""
        return time.time() + (sim_time - self.now()) / self.speed


def rfc1123(epoch: float) -> str:
    """Azure's ``NotBefore`` format, e.g. ``Mon, 11 Apr 2022 22:26:58 GMT``."""
    return formatdate(int(epoch), usegmt=True)


def rfc3339(epoch: float) -> str:
    """GCE's window time format, e.g. ``2025-08-28T21:56:21Z``."""
    return datetime.fromtimestamp(int(epoch), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
