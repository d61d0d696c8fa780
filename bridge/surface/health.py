"""Liveness and readiness, read from the bridge's own state.

Liveness (`/healthz`) answers "is this process doing its job at all": the event loop answers
and every watcher task is running (a watcher that fails is rebuilt from its checkpoint, so a
metadata outage is *not* a liveness failure: restarting the process would not fix it and
would only lose the long poll). Readiness (`/readyz`) answers "is it able to pass a notice on
right now": each watcher's last metadata request succeeded and every sink is healthy.

Sink health comes from a background loop that calls each sink's `healthcheck` every
`interval` seconds (not from the probe request itself: a load balancer probing every second
must not turn into a request per second to Pub/Sub), combined with the dispatcher's own view
(a sink whose deliveries are failing right now is not healthy, whatever its check says).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from sinks.api import Health, Sink

if TYPE_CHECKING:
    from bridge.pipeline.watchers.http import RequestStats
    from bridge.runner import Bridge

log = logging.getLogger("bridge.health")

Phase = Literal["starting", "detecting", "running", "stopping"]
#: How long a watcher that failed stays "not ready" after its last failure (longer than the
#: longest pause between two restarts, so a crash loop never looks ready in between).
CRASH_MEMORY: Final = 120.0


@dataclass(frozen=True, slots=True)
class Check:
    """One line of a health report: what was checked, whether it is fine, and why not."""

    name: str
    ok: bool
    detail: str

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


class HealthMonitor:
    """Holds the phase, the running bridge (once there is one) and the sinks' last checks."""

    def __init__(self, sink_check_interval: float = 30.0, sink_check_timeout: float = 10.0):
        self.phase: Phase = "starting"
        self.bridge: Bridge | None = None
        self.sink_health: dict[str, Health] = {}
        self._interval = sink_check_interval
        self._timeout = sink_check_timeout

    def attach(self, bridge: Bridge) -> None:
        self.bridge = bridge
        self.phase = "running"

    def liveness(self) -> list[Check]:
        if self.bridge is None:
            return [Check("process", True, f"{self.phase}: no cloud detected yet")]
        checks = [Check("process", True, self.phase)]
        for name, alive in sorted(self.bridge.watch_tasks_alive().items()):
            checks.append(Check(f"watcher:{name}", alive, "watching" if alive else "stopped"))
        checks.append(spool_check(self.bridge, self.bridge.config.delivery.spool_failure_timeout))
        return checks

    def readiness(self) -> list[Check]:
        bridge = self.bridge
        if bridge is None:
            return [Check("metadata", False, f"{self.phase}: no cloud detected yet")]
        checks: list[Check] = []
        for name in sorted(bridge.factories):
            watcher = bridge.watchers.get(name)
            if watcher is None:
                checks.append(Check(f"metadata:{name}", False, "not started"))
                continue
            checks.append(_metadata_check(f"metadata:{name}", watcher.stats, watcher.healthy))
            for part, stats in sorted(watcher.parts.items()):
                ok = stats.consecutive_failures == 0
                checks.append(_metadata_check(f"metadata:{name}:{part}", stats, ok))
            crash = bridge.watcher_crashes.get(name)
            if crash is not None and time.time() - crash.at < CRASH_MEMORY:
                checks.append(
                    Check(
                        f"watcher:{name}",
                        False,
                        f"failed {crash.count} time(s), last {time.time() - crash.at:.0f}s ago: "
                        f"{crash.error}",
                    )
                )
        checks.append(spool_check(bridge, None))
        for sink in bridge.sinks:
            delivery = bridge.dispatcher.stats[sink.name]
            health = self.sink_health.get(sink.name)
            if delivery.failing_since is not None:
                since = time.time() - delivery.failing_since
                checks.append(
                    Check(
                        f"sink:{sink.name}",
                        False,
                        f"deliveries failing for {since:.0f}s: {delivery.last_error}",
                    )
                )
            elif health is None:
                checks.append(Check(f"sink:{sink.name}", True, "not checked yet"))
            else:
                checks.append(Check(f"sink:{sink.name}", health.ok, health.detail))
        budget = bridge.actions.budget
        if budget is not None:
            checks.append(Check("coordination", *budget.check()))
        return checks

    async def check_sinks(self) -> None:
        """Run every sink's health check once (concurrently, each with a timeout)."""
        bridge = self.bridge
        if bridge is None:
            return

        async def one(sink: Sink) -> None:
            name = sink.name
            health = await sink_health(sink, self._timeout)
            previous = self.sink_health.get(name)
            if previous is not None and previous.ok != health.ok:
                level = logging.INFO if health.ok else logging.WARNING
                log.log(level, "sink %s is %s: %s", name, _word(health.ok), health.detail)
            self.sink_health[name] = health

        await asyncio.gather(*(one(sink) for sink in bridge.sinks))

    async def run_sink_checks(self) -> None:
        """Forever: check the sinks, then wait `interval` (cancel to stop)."""
        while True:
            await self.check_sinks()
            await asyncio.sleep(self._interval)


async def sink_health(sink: Sink, timeout: float) -> Health:
    """The sink's own health check, bounded: a check that hangs or raises is a failed check."""
    try:
        return await asyncio.wait_for(sink.healthcheck(), timeout)
    except TimeoutError:
        return Health(False, f"health check timed out after {timeout:g}s")
    except Exception as exc:
        log.exception("sink %s: health check raised", sink.name)
        return Health(False, f"health check raised {type(exc).__name__}: {exc}")


def _metadata_check(name: str, stats: RequestStats, healthy: bool) -> Check:
    """One readiness line for a metadata client, or one part of it (a GCE key)."""
    if healthy and stats.last_success is not None:
        age = time.time() - stats.last_success
        return Check(name, True, f"last answer {age:.0f}s ago")
    if stats.last_success is None and stats.consecutive_failures == 0:
        return Check(name, False, "waiting for the first answer")
    causes = ", ".join(f"{cause} x{n}" for cause, n in sorted(stats.errors.items()))
    return Check(name, False, f"{stats.consecutive_failures} failed request(s) in a row ({causes})")


def spool_check(bridge: Bridge, tolerance: float | None) -> Check:
    """The spool line: for readiness (`tolerance` None) any failing read or write fails it;
    for liveness only a failure older than `tolerance` seconds (a full disk that an operator
    is freeing is not yet a reason to restart; a spool that stays broken is)."""
    now = time.time()
    for kind, health in (("writes", bridge.spool.writes), ("reads", bridge.spool.reads)):
        if health.failing_since is None:
            continue
        since = now - health.failing_since
        if tolerance is None or since > tolerance:
            return Check("spool", False, f"{kind} failing for {since:.0f}s: {health.last_error}")
    return Check("spool", True, str(bridge.spool.path))


def _word(ok: bool) -> str:
    return "healthy" if ok else "unhealthy"


def all_ok(checks: list[Check]) -> bool:
    return all(check.ok for check in checks)
