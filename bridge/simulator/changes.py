"""A broadcast "something changed" signal for long-polls.

Long-poll handlers grab the current :class:`asyncio.Event`, re-check their condition and wait;
:meth:`ChangeSignal.fire` sets it and installs a fresh one, so every waiter wakes exactly when
state changes (no polling, no lost wake-ups).
"""

from __future__ import annotations

import asyncio


class ChangeSignal:
    def __init__(self) -> None:
        self._event = asyncio.Event()

    @property
    def current(self) -> asyncio.Event:
        return self._event

    def fire(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()
