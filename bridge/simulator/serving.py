"""What the simulator's servers share: `async with` starts one and stops it, and stopping
closes its aiohttp runner (its connections and its port)."""

from __future__ import annotations

import abc
from types import TracebackType
from typing import Self

from aiohttp import web


class Served(abc.ABC):
    """An aiohttp server of the simulator's (`Simulator`, `AzureGroup`)."""

    _runner: web.AppRunner | None = None

    @abc.abstractmethod
    async def start(self) -> None:
        """Bind and serve."""

    async def stop(self) -> None:
        """Close connections and free the port."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
