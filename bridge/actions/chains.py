"""The actions' tasks: each one tracked until it is done, and the actions of one notice run
one after another (a notice's chain: its hooks in configuration and transition order, then
an `approve-after-hooks`), while different notices run concurrently.

Once `stopping` is set, work that has not started is dropped (its action stays planned in
the spool for the next start) and what runs is left to finish or be cancelled by the stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Chains:
    """Tracks the actions' tasks and chains each notice's (see the module docstring)."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()
        self._chains: dict[str, asyncio.Task[None]] = {}
        #: Set by the stop: nothing new starts.
        self.stopping = False

    def track(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """`work` as a task of its own, tracked until done."""
        task = asyncio.create_task(work, name=f"action:{name}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def chained(self, chain: str, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` once the work chained before it for the same notice is done."""
        previous = self._chains.get(chain)

        async def after_previous() -> None:
            try:
                if previous is not None:
                    await asyncio.gather(previous, return_exceptions=True)
            except asyncio.CancelledError:
                work.close()
                raise
            if self.stopping:
                work.close()  # not started: stays planned for the next start
                return
            await work

        task = self.track(after_previous(), chain)
        self._chains[chain] = task

        def forget(done: asyncio.Task[None]) -> None:
            if self._chains.get(chain) is done:
                del self._chains[chain]

        task.add_done_callback(forget)
