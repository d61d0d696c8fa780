"""The :class:`Simulator`: one aiohttp server that plays GCE, Azure, AWS or several of them,
plus ``/_sim/``.

It owns the simulated clock, the provider states, the faults, the request log and the
scenario timeline.  All state lives on the event loop thread; :mod:`.threaded` marshals calls
from other threads onto it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypedDict, TypeVar

from aiohttp import web

from .attestation import Signer
from .changes import ChangeSignal
from .clock import SimClock
from .control import control_routes
from .faults import Faults
from .identity import Identity, merge_identity
from .part import BOTH, SimulatedProvider, choices, names, parts, spelled
from .requestlog import RequestLog, RequestRecord
from .scenario import Scenario, Step, load_scenario
from .serving import Served
from .vendor import vendor_middleware

logger = logging.getLogger("bridge.simulator")

#: A provider's name, "both" (GCE and Azure, as before AWS existed) or "all".
ProviderName = str
_State = TypeVar("_State")


class SimulatorOptions(TypedDict, total=False):
    """`Simulator`'s keywords after `provider` that `SimulatorThread` passes on unchanged."""

    scenario: str | Path | Scenario | None
    speed: float
    host: str
    port: int
    identity: Identity | dict[str, Any] | None


class Simulator(Served):
    """Local GCE metadata server, Azure IMDS Scheduled Events and/or AWS EC2 IMDS, scriptable
    and faultable: every registered provider's part (`SimulatedProvider`).

    Use ``async with Simulator(...) as sim`` (or ``await sim.start()`` / ``await sim.stop()``).
    ``sim.<provider>`` is that provider's state (``sim.gce``), and each part adds its URL
    (``sim.gce_url``) and what else it names (`SimulatedProvider.attributes`).
    """

    def __init__(
        self,
        provider: ProviderName = "both",
        scenario: str | Path | Scenario | None = None,
        speed: float = 1.0,
        host: str = "127.0.0.1",
        port: int = 0,
        identity: Identity | dict[str, Any] | None = None,
        on_step: Callable[[float, str], None] | None = None,
    ) -> None:
        if provider not in choices():
            raise ValueError(f"provider must be {spelled((*names(), 'both', 'all'))}")
        self.provider: ProviderName = provider
        #: The parts, the one answering every path no other claims last (its routes too).
        self.parts = sorted(parts(), key=lambda simulated: not simulated.path_prefix)
        self.host = host
        self.port = port
        self.clock = SimClock(speed)
        self.faults = Faults()
        self.signer = Signer()
        """The keys the identity documents are signed with (kept across scenario loads)."""
        self.log = RequestLog()
        self.on_step = on_step
        """Called with (sim time, text) for every step and automatic transition that fires."""
        self.fired: list[tuple[float, str]] = []
        """(sim time, description) of every timeline step fired, for tests and the CLI."""
        self.redirects_followed = 0
        self.signal = ChangeSignal()
        self.stopping = asyncio.Event()
        self._identity_overrides = identity
        self._wake = asyncio.Event()
        self._timeline: list[tuple[float, int, Step]] = []
        self._seq = itertools.count()
        self._runner: web.AppRunner | None = None
        self._scheduler: asyncio.Task[None] | None = None
        self.scenario: Scenario | None = None
        self.identity = Identity()
        self.states: dict[str, Any] = {}
        """Each provider's state, by name (also ``sim.<name>``)."""
        self.clock.on_advance(self._fire_due)
        self.load(scenario)

    # -- properties -------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        """``sim.<provider>`` (its state) and the parts' attributes (``sim.<provider>_url``)."""
        states = self.__dict__.get("states", {})
        if name in states:
            return states[name]
        for simulated in self.__dict__.get("parts", ()):
            attributes = simulated.attributes(self)
            if name in attributes:
                return attributes[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def state_of(self, name: str, kind: type[_State]) -> _State:
        """Provider `name`'s state, typed: what its own code reads it with."""
        found = self.states[name]
        if not isinstance(found, kind):
            raise TypeError(f"sim.{name} is a {type(found).__name__}, not a {kind.__name__}")
        return found

    @property
    def speed(self) -> float:
        return self.clock.speed

    @property
    def base_url(self) -> str:
        return f"http://{self.address}"

    @property
    def address(self) -> str:
        """``host:port``."""
        return f"{self.host}:{self.port}"

    @property
    def requests(self) -> list[RequestRecord]:
        """Vendor-endpoint requests seen so far (``/_sim/`` calls are not logged)."""
        return self.log.all()

    def serves(self, provider: str) -> bool:
        if self.provider == "all":
            return True
        return self.provider == provider or (self.provider == "both" and provider in BOTH)

    # -- scenario -------------------------------------------------------------------------
    def load(self, scenario: str | Path | Scenario | None) -> None:
        """(Re)start from a clean VM state, optionally playing ``scenario`` from sim time 0."""
        if isinstance(scenario, str | Path):
            scenario = load_scenario(scenario)
        if scenario is not None and not (
            self.provider in ("both", "all") or scenario.provider in (self.provider, "both", "all")
        ):
            raise ValueError(
                f"scenario {scenario.name!r} is for provider {scenario.provider!r}, "
                f"the simulator serves {self.provider!r}"
            )
        self.scenario = scenario
        identity = merge_identity(Identity(), scenario.identity if scenario else None)
        self.identity = merge_identity(identity, self._identity_overrides)
        self.clock.reset()
        self.faults.clear()
        self.states = {
            p.name: p.new_state(getattr(self.identity, p.name), self.clock, self._notify)
            for p in parts()
        }
        self._timeline = []
        self.fired = []
        if scenario is not None:
            for simulated in parts():
                state = self.states[simulated.name]
                state.quirks.update(scenario.quirks.get(simulated.name, {}))
                simulated.load(state, scenario.tables.get(simulated.name, {}))
            for step in scenario.steps:
                if self._step_applies(step):
                    heapq.heappush(self._timeline, (step.at, next(self._seq), step))
        self._notify()

    def _step_applies(self, step: Step) -> bool:
        owner = self._owner(step.action)
        return owner is None or self.serves(owner.name)

    def _owner(self, action: str) -> SimulatedProvider | None:
        """The provider whose scenario action this is (`<name>.<verb>`)."""
        for simulated in self.parts:
            if action.startswith(simulated.name + "."):
                return simulated
        return None

    @property
    def pending_steps(self) -> list[tuple[float, str]]:
        return [(at, step.describe()) for at, _, step in sorted(self._timeline)]

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind and serve; with ``port=0`` a free port is picked (read ``base_url``)."""
        app = web.Application(middlewares=[vendor_middleware(self)])
        for simulated in self.parts:  # before the control API's catch-all
            app.add_routes(simulated.control_routes(self))
        app.add_routes(control_routes(self))
        for simulated in self.parts:  # the one owning the catch-all comes last
            if self.serves(simulated.name) or not simulated.path_prefix:
                app.add_routes(simulated.routes(self))
        self.stopping = asyncio.Event()
        self._runner = web.AppRunner(
            app, handle_signals=False, access_log=None, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        sockets = self._runner.addresses
        if self.port == 0 and sockets:
            self.port = int(sockets[0][1])
        self.clock.reset()
        self._scheduler = asyncio.create_task(self._run_scheduler())

    async def stop(self) -> None:
        """Release hanging long-polls and hung requests, close connections, free the port."""
        self.stopping.set()
        self._wake.set()
        self.signal.fire()
        self.faults.clear()
        if self._scheduler is not None:
            done, _ = await asyncio.wait({self._scheduler}, timeout=2)
            if not done:
                self._scheduler.cancel()
            self._scheduler = None
        await super().stop()

    # -- timeline ---------------------------------------------------------------------------
    def _notify(self) -> None:
        self.signal.fire()
        self._wake.set()

    async def _run_scheduler(self) -> None:
        # asyncio.wait (not wait_for) so a wake-up racing with cancellation cannot swallow it
        while not self.stopping.is_set():
            self._fire_due()
            nxt = self._next_due()
            timeout = 0.5
            if nxt is not None:
                timeout = min(timeout, max(0.0, self.clock.real_delay(nxt - self.clock.now())))
            self._wake.clear()
            waiter = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({waiter}, timeout=timeout)
            finally:
                waiter.cancel()

    def _next_due(self) -> float | None:
        times = [self._timeline[0][0]] if self._timeline else []
        due = self._next_transition()
        if due is not None:
            times.append(due[0])
        return min(times) if times else None

    def _next_transition(self) -> tuple[float, SimulatedProvider] | None:
        """The earliest automatic transition of a provider's state (Azure's), if any."""
        found: tuple[float, SimulatedProvider] | None = None
        for simulated in self.parts:
            at = simulated.next_due(self.states[simulated.name])
            if at is not None and (found is None or at < found[0]):
                found = (at, simulated)
        return found

    def _fire_due(self) -> None:
        """Fire steps and automatic transitions that are due, in sim-time order."""
        now = self.clock.now()
        while True:
            step_at = self._timeline[0][0] if self._timeline else None
            due = self._next_transition()
            if due is not None and due[0] <= now and (step_at is None or due[0] < step_at):
                at, simulated = due
                text = simulated.fire_due(self.states[simulated.name], at)
                if text:
                    self._record(at, text)
                continue
            if step_at is None or step_at > now:
                return
            _, _, step = heapq.heappop(self._timeline)
            try:
                self._execute(step_at, step)
            except Exception:
                logger.exception("scenario step failed: %s", step.describe())

    def _execute(self, at: float, step: Step) -> None:
        skipping = [p for p in self.parts if p.skips_warnings(self.states[p.name])]
        if step.unwatched_delay is not None and skipping:
            # Compute Engine skips the 60 s warning when the key was not queried since the
            # last event: the value only appears when the event itself begins.
            deferred = replace(step, unwatched_delay=None)
            heapq.heappush(self._timeline, (at + step.unwatched_delay, next(self._seq), deferred))
            self._record(
                at,
                f"{skipping[0].unwatched_reason}: warning skipped, "
                f"{step.action} postponed by {step.unwatched_delay:g} s",
            )
            return
        params = dict(step.params)
        action = step.action
        owner = self._owner(action)
        if owner is not None:
            owner.execute(self, action, params, at)
        elif action == "fault.set":
            if isinstance(params.get("status_burst"), list):
                params["status_burst"] = tuple(params["status_burst"])
            self.faults.set(**params)
        elif action == "fault.clear":
            self.faults.clear(params.get("provider", "all"))
        self._record(at, step.describe())

    def _record(self, at: float, text: str) -> None:
        self.fired.append((at, text))
        logger.info("t=%.1fs %s", at, text)
        if self.on_step is not None:
            self.on_step(at, text)

    # -- snapshot -----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Everything ``GET /_sim/state`` shows."""
        return {
            "provider": self.provider,
            "scenario": self.scenario.name if self.scenario else None,
            "speed": self.speed,
            "sim_time": self.clock.now(),
            "base_url": self.base_url,
            **{f"{p.name}_url": p.url(self.base_url) for p in parts()},
            "identity": {p.name: p.identity_json(getattr(self.identity, p.name)) for p in parts()},
            **{p.name: self.states[p.name].snapshot() for p in parts()},
            "faults": self.faults.snapshot(),
            "fired_steps": [{"at": at, "step": text} for at, text in self.fired],
            "pending_steps": [{"at": at, "step": text} for at, text in self.pending_steps],
            "requests_seen": len(self.log.all()),
            "redirects_followed": self.redirects_followed,
        }
