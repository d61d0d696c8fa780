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
from types import TracebackType
from typing import Any, Literal

from aiohttp import web

from .aws import AwsState
from .aws_http import aws_control_routes, aws_routes
from .azure import AzureState
from .azure_http import azure_routes
from .changes import ChangeSignal
from .clock import SimClock, rfc3339
from .control import control_routes
from .faults import Faults
from .gce import GceState
from .gce_http import gce_routes
from .identity import Identity, merge_identity
from .requestlog import RequestLog, RequestRecord
from .scenario import Scenario, Step, load_scenario
from .vendor import vendor_middleware

logger = logging.getLogger("bridge.simulator")

#: "both" is GCE and Azure (as before AWS existed); "all" adds AWS.
ProviderName = Literal["gce", "azure", "both", "aws", "all"]
_UPCOMING_TIME_FIELDS = {
    "window_start_in": "window_start_time",
    "window_end_in": "window_end_time",
    "latest_window_start_in": "latest_window_start_time",
}


class Simulator:
    """Local GCE metadata server, Azure IMDS Scheduled Events and/or AWS EC2 IMDS, scriptable
    and faultable.

    Use ``async with Simulator(...) as sim`` (or ``await sim.start()`` / ``await sim.stop()``).
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
        if provider not in ("gce", "azure", "both", "aws", "all"):
            raise ValueError("provider must be 'gce', 'azure', 'aws', 'both' or 'all'")
        self.provider: ProviderName = provider
        self.host = host
        self.port = port
        self.clock = SimClock(speed)
        self.faults = Faults()
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
        self.gce: GceState
        self.azure: AzureState
        self.aws: AwsState
        self.clock.on_advance(self._fire_due)
        self.load(scenario)

    # -- properties -------------------------------------------------------------------------
    @property
    def speed(self) -> float:
        return self.clock.speed

    @property
    def base_url(self) -> str:
        return f"http://{self.gce_host}"

    @property
    def gce_host(self) -> str:
        """``host:port``, the form ``GCE_METADATA_HOST`` takes."""
        return f"{self.host}:{self.port}"

    @property
    def gce_url(self) -> str:
        return f"{self.base_url}/computeMetadata/v1/"

    @property
    def azure_url(self) -> str:
        return f"{self.base_url}/metadata/"

    @property
    def aws_url(self) -> str:
        """The IMDS base URL (`source.aws.imds_url`): paths start with ``latest/``."""
        return f"{self.base_url}/"

    @property
    def requests(self) -> list[RequestRecord]:
        """Vendor-endpoint requests seen so far (``/_sim/`` calls are not logged)."""
        return self.log.all()

    def serves(self, provider: str) -> bool:
        if self.provider == "all":
            return True
        return self.provider == provider or (self.provider == "both" and provider != "aws")

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
        self.gce = GceState(self.identity.gce, self._notify)
        self.azure = AzureState(self.identity.azure, self.clock, self._notify)
        self.aws = AwsState(self.identity.aws, self.clock, self._notify)
        self._timeline = []
        self.fired = []
        if scenario is not None:
            self.gce.quirks.update(scenario.quirks.get("gce", {}))
            self.azure.quirks.update(scenario.quirks.get("azure", {}))
            self.aws.quirks.update(scenario.quirks.get("aws", {}))
            for key, value in scenario.gce_initial.items():
                self.gce.values[key] = value
            for step in scenario.steps:
                if self._step_applies(step):
                    heapq.heappush(self._timeline, (step.at, next(self._seq), step))
        self._notify()

    def _step_applies(self, step: Step) -> bool:
        if step.action.startswith("gce."):
            return self.serves("gce")
        if step.action.startswith("azure."):
            return self.serves("azure")
        if step.action.startswith("aws."):
            return self.serves("aws")
        return True

    @property
    def pending_steps(self) -> list[tuple[float, str]]:
        return [(at, step.describe()) for at, _, step in sorted(self._timeline)]

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind and serve; with ``port=0`` a free port is picked (read ``base_url``)."""
        app = web.Application(middlewares=[vendor_middleware(self)])
        app.add_routes(aws_control_routes(self))  # before the control API's catch-all
        app.add_routes(control_routes(self))
        if self.serves("azure"):
            app.add_routes(azure_routes(self))
        if self.serves("aws"):
            app.add_routes(aws_routes(self))
        app.add_routes(gce_routes(self))  # GCE owns the catch-all, so it comes last
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
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Simulator:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

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
        azure_due = self.azure.next_due()
        if azure_due is not None:
            times.append(azure_due)
        return min(times) if times else None

    def _fire_due(self) -> None:
        """Fire steps and Azure auto-transitions that are due, in sim-time order."""
        now = self.clock.now()
        while True:
            step_at = self._timeline[0][0] if self._timeline else None
            azure_at = self.azure.next_due()
            if azure_at is not None and azure_at <= now and (step_at is None or azure_at < step_at):
                text = self.azure.fire_due(azure_at)
                if text:
                    self._record(azure_at, text)
                continue
            if step_at is None or step_at > now:
                return
            _, _, step = heapq.heappop(self._timeline)
            try:
                self._execute(step_at, step)
            except Exception:
                logger.exception("scenario step failed: %s", step.describe())

    def _execute(self, at: float, step: Step) -> None:
        if step.unwatched_delay is not None and not self.gce.maintenance_event_watched:
            # Compute Engine skips the 60 s warning when the key was not queried since the
            # last event: the value only appears when the event itself begins.
            deferred = replace(step, unwatched_delay=None)
            heapq.heappush(self._timeline, (at + step.unwatched_delay, next(self._seq), deferred))
            self._record(
                at,
                "instance/maintenance-event not queried since the last event: warning skipped, "
                f"{step.action} postponed by {step.unwatched_delay:g} s",
            )
            return
        params = dict(step.params)
        action = step.action
        if action == "gce.set":
            self.gce.set(str(params["key"]), str(params["value"]))
        elif action == "gce.upcoming":
            for rel, absolute in _UPCOMING_TIME_FIELDS.items():
                if rel in params:
                    params[absolute] = rfc3339(self.clock.wall_time_of(at + params.pop(rel)))
            self.gce.set_upcoming_maintenance(params)
        elif action == "gce.upcoming.clear":
            self.gce.set_upcoming_maintenance(None)
        elif action == "azure.add":
            self.azure.add_event(**params, at=at)
        elif action == "azure.start":
            self.azure.start_event(str(params["event_id"]), at=at)
        elif action == "azure.remove":
            self.azure.remove_event(str(params["event_id"]))
        elif action == "azure.approve":
            self.azure.approve([str(params["event_id"])], client="scenario", user_agent="")
        elif action.startswith("aws."):
            self._execute_aws(action, params, at)
        elif action == "fault.set":
            if isinstance(params.get("status_burst"), list):
                params["status_burst"] = tuple(params["status_burst"])
            self.faults.set(**params)
        elif action == "fault.clear":
            self.faults.clear(params.get("provider", "all"))
        self._record(at, step.describe())

    def _execute_aws(self, action: str, params: dict[str, Any], at: float) -> None:
        aws = self.aws
        if action == "aws.spot":
            action_name = str(params.get("spot_action", "terminate"))
            aws.interrupt(action_name, float(params.get("time_in", 120.0)), at=at)
        elif action == "aws.spot.clear":
            aws.clear_spot()
        elif action == "aws.rebalance":
            aws.recommend_rebalance(at=at)
        elif action == "aws.rebalance.clear":
            aws.clear_rebalance()
        elif action == "aws.event":
            aws.add_event(**params, at=at)
        elif action == "aws.event.state":
            aws.set_event_state(str(params["event_id"]), str(params["state"]))
        elif action == "aws.event.complete":
            aws.complete_event(str(params["event_id"]))
        elif action == "aws.event.cancel":
            aws.cancel_event(str(params["event_id"]))
        elif action == "aws.event.remove":
            aws.remove_event(str(params["event_id"]))
        elif action == "aws.lifecycle":
            aws.set_lifecycle(params["state"] or None)
        elif action == "aws.tokens.expire":
            aws.expire_tokens()

    def _record(self, at: float, text: str) -> None:
        self.fired.append((at, text))
        logger.info("t=%.1fs %s", at, text)
        if self.on_step is not None:
            self.on_step(at, text)

    # -- snapshot -----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Everything ``GET /_sim/state`` shows."""
        from dataclasses import asdict

        return {
            "provider": self.provider,
            "scenario": self.scenario.name if self.scenario else None,
            "speed": self.speed,
            "sim_time": self.clock.now(),
            "base_url": self.base_url,
            "gce_url": self.gce_url,
            "azure_url": self.azure_url,
            "aws_url": self.aws_url,
            "identity": {
                "gce": asdict(self.identity.gce),
                "azure": asdict(self.identity.azure)
                | {"resource_id": self.identity.azure.resource_id},
                "aws": asdict(self.identity.aws),
            },
            "gce": self.gce.snapshot(),
            "azure": self.azure.snapshot(),
            "aws": self.aws.snapshot(),
            "faults": self.faults.snapshot(),
            "fired_steps": [{"at": at, "step": text} for at, text in self.fired],
            "pending_steps": [{"at": at, "step": text} for at, text in self.pending_steps],
            "requests_seen": len(self.log.all()),
            "redirects_followed": self.redirects_followed,
        }
