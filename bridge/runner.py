"""The running bridge: watchers feed the spool, the dispatcher drains it into the sinks.

One direction only. A watcher's update (its notices and its checkpoint) is committed to the
spool before any sink is told; if the commit fails (disk full) it is retried with backoff
while the watcher stays paused at that update, so nothing is announced that is not on disk
and nothing observed is dropped. A watcher that fails unexpectedly is rebuilt from its last
committed checkpoint after a backoff instead of taking the process down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from tenacity import RetryCallState

from bridge import __version__, contract, sink_registry
from bridge.actions.engine import Actions
from bridge.config import Config
from bridge.contract import ProviderName as ProviderName
from bridge.infra import tracing
from bridge.infra.backoff import keep_running, retry_logger, retry_until_done
from bridge.infra.observe import Exporter, HealthSource, ReadinessLine
from bridge.pipeline.approver import Approver
from bridge.pipeline.dispatch import Dispatcher
from bridge.pipeline.enrollment import Enrollment
from bridge.pipeline.events import to_event
from bridge.pipeline.heartbeat import Heartbeats
from bridge.pipeline.in_force import InForce
from bridge.pipeline.model import Instance, Notice, Status
from bridge.pipeline.sink_checks import SinkChecks
from bridge.pipeline.spool import NewEvent, Spool, SpoolError
from bridge.pipeline.spool_checks import SpoolChecks
from bridge.pipeline.supervision import Supervision
from bridge.pipeline.watchers.base import Update, Watcher
from bridge.providers import plugins as providers
from bridge.sinkapi import Sink

log = logging.getLogger("bridge")

WatcherFactory = Callable[[dict[str, Any] | None], Watcher]
Sleep = Callable[[float], Awaitable[None]]


def watcher_factory(
    config: Config, provider: ProviderName, **client_options: Any
) -> WatcherFactory:
    """A function that builds the provider's watcher (`bridge.providers.plugins`) from a
    checkpoint.

    `client_options` go to the metadata client (tests shorten its backoff). Every watcher
    the function builds shares one `RequestStats`, so the metrics survive a rebuild.
    """
    from bridge.pipeline.watchers.http import RequestStats

    client_options.setdefault("stats", RequestStats())
    plugin = providers.get(provider)

    def build(checkpoint: dict[str, Any] | None) -> Watcher:
        return plugin.watcher(config, checkpoint, **client_options)

    return build


def build_sinks(config: Config) -> list[Sink]:
    return [
        sink_registry.create(sink_config, name)
        for sink_config, name in zip(config.sinks, config.sink_names(), strict=True)
    ]


def describe(notice: Notice) -> str:
    when = f", not before {notice.not_before:%Y-%m-%d %H:%M:%S}Z" if notice.not_before else ""
    return (
        f"{notice.provider.value} {notice.kind.value} {notice.status.value} "
        f"for {notice.instance.name} ({notice.notice_id}){when}"
    )


@dataclass(frozen=True, slots=True)
class Observed:
    """What the operator surface reads of a running bridge, handed to it once.

    Each component as an exporter (`/metrics`, in this order) and a health source
    (`/healthz` and `/readyz`, in this order), never the bridge itself: the surface asks
    the components and cannot reach into anything else. `sink_checks` is also one of the
    health sources: the one whose checks the surface runs on its own schedule.
    """

    providers: tuple[str, ...]
    exporters: tuple[Exporter, ...]
    health: tuple[HealthSource, ...]
    sink_checks: SinkChecks
    #: What the status API reads: the notices in force and `[status] eligible_horizon`.
    in_force: InForce
    eligible_horizon: float


class _NoApprover:
    async def approve(self, event_id: str) -> None:
        raise RuntimeError("no watched cloud can approve maintenance")


@dataclass
class Bridge:
    """Runs until `stop` is set; see the module docstring."""

    config: Config
    factories: dict[str, WatcherFactory]
    sinks: Sequence[Sink]
    spool: Spool
    sleep: Sleep = asyncio.sleep
    dispatcher: Dispatcher = field(init=False)
    actions: Actions = field(init=False)
    #: The watchers, their identities, notice counts and crashes (see `Supervision`).
    supervision: Supervision = field(init=False)
    #: The sinks' health checks and readiness (run by the surface's schedule).
    sink_checks: SinkChecks = field(init=False)
    #: The notices in force: what `/v1/notices` serves and approvals check.
    in_force: InForce = field(init=False, default_factory=InForce)
    #: The credential from the fleet (`[identity]`), carried by the webhook and bus sinks.
    enrollment: Enrollment | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.supervision = Supervision(self.factories)
        delivery = self.config.delivery
        self.dispatcher = Dispatcher(
            self.spool,
            self.sinks,
            retry_initial=delivery.retry_initial,
            retry_max=delivery.retry_max,
        )
        self.actions = Actions(
            self.config, self.spool, self._approver().approve, self.in_force.is_scheduled
        )
        self.sink_checks = SinkChecks(self.sinks, self.dispatcher.stats)
        if self.config.identity is not None:
            self.enrollment = Enrollment(self.config.identity, self.config)
            for sink in self.sinks:
                if hasattr(sink, "enrollment"):  # the sinks that carry the credential
                    sink.enrollment = self.enrollment

    @property
    def watchers(self) -> Mapping[str, Watcher]:
        """The current watcher per provider (tests and the heartbeats read them)."""
        return self.supervision.watchers

    @property
    def instances(self) -> Mapping[str, Instance]:
        """The VM's identity per watcher, once it has identified it."""
        return self.supervision.instances

    @property
    def notices_seen(self) -> int:
        return self.supervision.notices_seen

    def observed(self) -> Observed:
        """The components as the operator surface reads them (see `Observed`)."""
        budget = self.actions.budget
        coordination = () if budget is None else (ReadinessLine("coordination", budget.check),)
        spool = SpoolChecks(self.spool, self.config.delivery.spool_failure_timeout)
        return Observed(
            providers=tuple(self.supervision.names),
            exporters=(
                self.supervision,
                self.dispatcher,
                self.spool,
                self.actions,
                self.sink_checks,
            ),
            health=(self.supervision, spool, self.sink_checks, *coordination),
            sink_checks=self.sink_checks,
            in_force=self.in_force,
            eligible_horizon=self.config.status.eligible_horizon,
        )

    def _approver(self) -> Approver:
        """The approver of the first watched cloud that can approve (Azure); approvals are
        only planned for such a cloud's notices, so the fallback is never called in practice."""
        for name in providers.names():
            if name in self.factories:
                found = providers.get(name).approver(partial(self.supervision.watchers.get, name))
                if found is not None:
                    return found
        return _NoApprover()

    async def _commit(
        self, name: str, update: Update
    ) -> tuple[list[contract.Event], dict[str, str]]:
        """Spool the update's events, the watcher's checkpoint, the actions they call for and
        the notices in force, all in one transaction; the events come back typed, for the
        actions and the notices in force."""
        typed = [to_event(notice) for notice in update.notices]
        rows = [NewEvent(e.id, e.source, e.type, contract.encode(e)) for e in typed]
        traced, spooling = [(e.traceparent, e.id) for e in typed], time.time()
        observed = min((n.observed_at.timestamp() for n in update.notices), default=spooling)
        tracing.record("poll", traced, observed, {"maintenance_bridge.watcher": name})
        plan = self.actions.plan(typed)
        in_force: dict[str, bytes | None] = {}
        for notice, row in zip(update.notices, rows, strict=True):
            ended = notice.status in (Status.COMPLETED, Status.CANCELLED)
            in_force[f"{name}\t{notice.notice_id}"] = None if ended else row.body
        await retry_until_done(
            lambda: self.spool.commit(
                rows, {name: update.checkpoint}, plan=plan, in_force=in_force
            ),
            retry_on=SpoolError,
            initial=0.5,
            maximum=30.0,
            before_sleep=retry_logger(log, f"cannot spool {len(rows)} notice(s)"),
            sleep=self.sleep,
        )
        tracing.record("spool", traced, spooling, {"maintenance_bridge.watcher": name})
        return typed, plan

    async def _watch(self, name: str) -> None:
        """Run the watcher `name`, rebuilt from its last checkpoint after each failure by
        the one backoff policy (1 s, doubling to 60 s, from 1 s again after a commit); each
        failure is logged with its traceback and recorded for `/readyz`."""
        log_failure = retry_logger(
            log, f"{name} watcher failed; restarting it from its checkpoint", traceback=True
        )

        def failed(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            if isinstance(exc, Exception):
                self.supervision.crashed(name, exc)
            log_failure(state)

        await keep_running(
            partial(self._watch_once, name),
            retry_on=Exception,
            initial=1.0,
            maximum=60.0,
            before_sleep=failed,
            sleep=self.sleep,
        )

    async def _watch_once(self, name: str, progressed: Callable[[], None]) -> None:
        """One watcher's life, from its checkpoint until it fails (or is cancelled)."""
        watcher = self.factories[name](await self._checkpoint_of(name))
        self.supervision.watchers[name] = watcher
        try:
            instance = await watcher.identify()
            self.supervision.instances[name] = instance
            if self.enrollment is not None:
                self.enrollment.identified(name, instance)
            log.info("watching %s instance %s (%s)", name, instance.name, instance.source)
            async for update in watcher.watch():
                events, plan = await self._commit(name, update)
                # The commit woke the dispatcher: its POST of these events goes out first,
                # the bookkeeping (counters, notices in force, the log line, actions) right
                # after, before any other request or answer is handled.
                await asyncio.sleep(0)
                self.supervision.committed(name, update.notices)
                for notice, event in zip(update.notices, events, strict=True):
                    self.in_force.remember(name, event)
                    log.info(
                        "notice: %s",
                        describe(notice),
                        extra={"event_id": event.id, "event_type": event.type},
                    )
                self.actions.planned(plan)
                self.actions.observed(events)
                progressed()
        finally:
            await watcher.aclose()

    async def _checkpoint_of(self, name: str) -> dict[str, Any] | None:
        """The watcher's last checkpoint; for a provider that approves events, with the
        events approved in any run (`ProviderPlugin.approves_events`).

        An approval is recorded in the spool by the actions, not in the checkpoint: after a
        restart the watcher must still know that an event which vanished while we were down
        ran (we approved it, so it started) rather than was cancelled.
        """
        checkpoint = await self.spool.load_checkpoint(name)
        plugin = providers.find(name)
        if checkpoint is not None and plugin is not None and plugin.approves_events:
            approved = set(checkpoint.get("approved", ())) | await self.actions.approved_ids()
            checkpoint["approved"] = sorted(approved)
        return checkpoint

    async def _restore(self) -> None:
        """The notices in force when the last run stopped: its watchers will not announce
        them again, yet the status API must know them."""
        self.in_force.restore(await self.spool.in_force())

    async def run(self, stop: asyncio.Event) -> None:
        await self.spool.open()
        try:
            tracing.configure(self.config.tracing, __version__)  # bridge/infra/tracing.py
            await self._restore()
            self.dispatcher.start()
            await self.actions.start()
            self.dispatcher.notify()  # deliver what a previous run left behind
            self.supervision.tasks = {
                name: asyncio.create_task(self._watch(name), name=f"watch:{name}")
                for name in self.factories
            }
            tasks = list(self.supervision.tasks.values())
            beats = Heartbeats(
                self.spool,
                self.supervision.instances,
                self.supervision.watchers,
                self.config.heartbeat.interval,
            )
            beating = asyncio.create_task(beats.run(), name="heartbeat")
            stopper = asyncio.create_task(stop.wait())
            _done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in [*tasks, beating]:
                task.cancel()
            stopper.cancel()
            await asyncio.gather(*tasks, beating, return_exceptions=True)
            await self.actions.stop(self.config.delivery.shutdown_timeout)
            log.info(
                "stopping: delivering in-flight events (deadline %.0fs)",
                self.config.delivery.shutdown_timeout,
            )
            await self.dispatcher.stop(self.config.delivery.shutdown_timeout)
        finally:
            tracing.shutdown()
            await self.spool.close()
