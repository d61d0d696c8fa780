""":class:`SimulatorThread`: the simulator on a private event loop in a daemon thread.

For blocking clients (``requests``, the vendors' samples) and tests that spawn subprocesses.
All simulator state belongs to that loop, so every call from the test thread - methods,
attribute reads and writes, even nested ones like ``sim.gce.quirks.upcoming_none = "404"`` -
is marshalled onto it and waited for.  That keeps state changes atomic with respect to request
handling and wakes long-polls from the right thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, Unpack, cast

from .clock import SimClock
from .faults import Faults, FaultSet
from .identity import Identity
from .part import parts
from .requestlog import RequestRecord
from .scenario import Scenario
from .server import ProviderName, Simulator, SimulatorOptions

T = TypeVar("T")
_PROXIED = (
    *(kind for simulated in parts() for kind in simulated.proxied),
    Faults,
    FaultSet,
    SimClock,
)


class _LoopCaller:
    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        self.loop = loop
        self.thread = thread

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if threading.current_thread() is self.thread:
            return fn(*args, **kwargs)
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return future.result(timeout=30)


class LoopProxy:
    """Forwards attribute access and calls on ``target`` to the simulator's loop thread."""

    def __init__(self, target: object, caller: _LoopCaller) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_caller", caller)

    def __getattr__(self, name: str) -> Any:
        target = object.__getattribute__(self, "_target")
        caller: _LoopCaller = object.__getattribute__(self, "_caller")
        value = caller.call(getattr, target, name)
        if isinstance(value, _PROXIED):
            return LoopProxy(value, caller)
        if callable(value):

            def call(*args: Any, **kwargs: Any) -> Any:
                return caller.call(lambda: copy.deepcopy(value(*args, **kwargs)))

            return call
        return caller.call(copy.deepcopy, value)

    def __setattr__(self, name: str, value: Any) -> None:
        target = object.__getattribute__(self, "_target")
        caller: _LoopCaller = object.__getattribute__(self, "_caller")
        caller.call(setattr, target, name, value)

    def __repr__(self) -> str:
        return f"LoopProxy({object.__getattribute__(self, '_target')!r})"


class SimulatorThread:
    """Blocking wrapper: ``with SimulatorThread(provider="gce", scenario=...) as sim: ...``.

    Same constructor and attributes as :class:`Simulator`; each provider's state (``gce``,
    ``azure``, ...), ``faults`` and ``clock`` are thread-safe proxies.
    """

    def __init__(
        self, provider: ProviderName = "both", **options: Unpack[SimulatorOptions]
    ) -> None:
        self._kwargs: dict[str, Any] = {"provider": provider, **options}
        self._sim: Simulator | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._caller: _LoopCaller | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="maintenance-bridge-simulator", daemon=True
        )
        self._thread.start()
        ready.result(timeout=30)
        self._caller = _LoopCaller(self._loop, self._thread)

    def _run(self, ready: concurrent.futures.Future[None]) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)

        async def boot() -> None:
            self._sim = Simulator(**self._kwargs)
            await self._sim.start()

        try:
            self._loop.run_until_complete(boot())
        except BaseException as exc:
            ready.set_exception(exc)
            self._loop.close()
            return
        ready.set_result(None)
        self._loop.run_forever()
        self._loop.close()

    def stop(self) -> None:
        if self._loop is None or self._thread is None or self._sim is None:
            return
        future = asyncio.run_coroutine_threadsafe(self._sim.stop(), self._loop)
        future.result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop = None
        self._thread = None

    def __enter__(self) -> SimulatorThread:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- access -----------------------------------------------------------------------------
    @property
    def simulator(self) -> Simulator:
        """The underlying :class:`Simulator` (touch it only through :meth:`call`)."""
        if self._sim is None:
            raise RuntimeError("SimulatorThread is not started")
        return self._sim

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on the simulator's loop thread and return its result."""
        if self._caller is None:
            raise RuntimeError("SimulatorThread is not started")
        return self._caller.call(fn, *args, **kwargs)

    def _proxy(self, name: str) -> Any:
        if self._caller is None:
            raise RuntimeError("SimulatorThread is not started")
        return LoopProxy(self.call(getattr, self.simulator, name), self._caller)

    def __getattr__(self, name: str) -> Any:
        """A provider's state (``sim.gce``, proxied) and the parts' attributes
        (``sim.gce_url``), as :class:`Simulator` has them."""
        if name.startswith("_"):
            raise AttributeError(name)
        if name in {simulated.name for simulated in parts()}:
            return self._proxy(name)
        return getattr(self.simulator, name)

    @property
    def faults(self) -> Faults:
        return cast(Faults, self._proxy("faults"))

    @property
    def clock(self) -> SimClock:
        return cast(SimClock, self._proxy("clock"))

    @property
    def requests(self) -> list[RequestRecord]:
        return self.call(lambda: copy.deepcopy(self.simulator.requests))

    @property
    def identity(self) -> Identity:
        return self.call(lambda: self.simulator.identity)

    @property
    def fired(self) -> list[tuple[float, str]]:
        return self.call(lambda: list(self.simulator.fired))

    def load(self, scenario: str | Path | Scenario | None) -> None:
        self.call(self.simulator.load, scenario)

    def state(self) -> dict[str, Any]:
        return self.call(self.simulator.state)

    @property
    def provider(self) -> str:
        return self.simulator.provider

    @property
    def speed(self) -> float:
        return self.simulator.speed

    @property
    def base_url(self) -> str:
        return self.simulator.base_url
