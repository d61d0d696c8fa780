"""Liveness and readiness, asked of the components the bridge hands over.

Liveness (`/healthz`) answers "is this process doing its job at all": the event loop answers
and every watcher task is running (a watcher that fails is rebuilt from its checkpoint, so a
metadata outage is *not* a liveness failure: restarting the process would not fix it and
would only lose the long poll). Readiness (`/readyz`) answers "is it able to pass a notice on
right now": each watcher's last metadata request succeeded and every sink is healthy.

The lines come from the components themselves (`bridge.infra.observe.HealthSource`: the
watchers' supervision, the spool, the sinks' checks, the coordination budget), handed over
once as `bridge.runner.Observed` when the bridge is attached; this module adds the phase and
runs the sinks' checks on its schedule. It never reaches through the bridge.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from bridge.infra.observe import Check as Check
from bridge.infra.observe import all_ok as all_ok

if TYPE_CHECKING:
    from bridge.runner import Bridge, Observed

Phase = Literal["starting", "detecting", "running", "stopping"]


class HealthMonitor:
    """Holds the phase and, once a bridge runs, what it hands the surface (`observed`)."""

    def __init__(self, sink_check_interval: float = 30.0, sink_check_timeout: float = 10.0):
        self.phase: Phase = "starting"
        self.observed: Observed | None = None
        self._interval = sink_check_interval
        self._timeout = sink_check_timeout

    def attach(self, bridge: Bridge) -> None:
        self.observed = bridge.observed()
        self.phase = "running"

    def liveness(self) -> list[Check]:
        if self.observed is None:
            return [Check("process", True, f"{self.phase}: no cloud detected yet")]
        checks = [Check("process", True, self.phase)]
        for source in self.observed.health:
            checks.extend(source.liveness())
        return checks

    def readiness(self) -> list[Check]:
        if self.observed is None:
            return [Check("metadata", False, f"{self.phase}: no cloud detected yet")]
        return [check for source in self.observed.health for check in source.readiness()]

    async def check_sinks(self) -> None:
        """Run every sink's health check once (concurrently, each with a timeout)."""
        if self.observed is not None:
            await self.observed.sink_checks.check(self._timeout)

    async def run_sink_checks(self) -> None:
        """Forever: check the sinks, then wait `interval` (cancel to stop)."""
        if self.observed is not None:
            await self.observed.sink_checks.run(self._interval, self._timeout)
