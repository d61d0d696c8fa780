"""The sinks' health: their own checks on a schedule, combined with the dispatcher's view.

Sink health comes from a loop that calls each sink's `healthcheck` every `interval` seconds
(not from the probe request itself: a load balancer probing every second must not turn into
a request per second to Pub/Sub), combined with the dispatcher's delivery stats (a sink whose
deliveries are failing right now is not healthy, whatever its check says). This component
keeps the last answers and exports the `/readyz` lines and the `sink_up` gauge from them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence

from bridge.infra.observe import Check
from bridge.infra.prometheus import PREFIX, Exposition
from bridge.pipeline.dispatch import SinkStats
from bridge.sinkapi import Health, Sink

log = logging.getLogger("bridge.health")


async def sink_health(sink: Sink, timeout: float) -> Health:
    """The sink's own health check, bounded: a check that hangs or raises is a failed check."""
    try:
        return await asyncio.wait_for(sink.healthcheck(), timeout)
    except TimeoutError:
        return Health(False, f"health check timed out after {timeout:g}s")
    except Exception as exc:
        log.exception("sink %s: health check raised", sink.name)
        return Health(False, f"health check raised {type(exc).__name__}: {exc}")


class SinkChecks:
    """The sinks with their delivery stats (`Dispatcher.stats`), and their last checks."""

    def __init__(self, sinks: Sequence[Sink], deliveries: Mapping[str, SinkStats]) -> None:
        self._sinks = list(sinks)
        self._deliveries = deliveries
        #: The last answer of each sink's own health check.
        self.last: dict[str, Health] = {}

    async def check(self, timeout: float) -> None:
        """Run every sink's health check once (concurrently, each with `timeout`)."""

        async def one(sink: Sink) -> None:
            health = await sink_health(sink, timeout)
            previous = self.last.get(sink.name)
            if previous is not None and previous.ok != health.ok:
                level = logging.INFO if health.ok else logging.WARNING
                word = "healthy" if health.ok else "unhealthy"
                log.log(level, "sink %s is %s: %s", sink.name, word, health.detail)
            self.last[sink.name] = health

        await asyncio.gather(*(one(sink) for sink in self._sinks))

    async def run(self, interval: float, timeout: float) -> None:
        """Forever: check the sinks, then wait `interval` (cancel to stop)."""
        while True:
            await self.check(timeout)
            await asyncio.sleep(interval)

    def liveness(self) -> list[Check]:
        return []

    def readiness(self) -> list[Check]:
        checks = []
        for sink in self._sinks:
            delivery = self._deliveries[sink.name]
            health = self.last.get(sink.name)
            if delivery.failing_since is not None:
                since = time.time() - delivery.failing_since
                detail = f"deliveries failing for {since:.0f}s: {delivery.last_error}"
                checks.append(Check(f"sink:{sink.name}", False, detail))
            elif health is None:
                checks.append(Check(f"sink:{sink.name}", True, "not checked yet"))
            else:
                checks.append(Check(f"sink:{sink.name}", health.ok, health.detail))
        return checks

    def export(self, out: Exposition) -> None:
        """`sink_up`: 1 when the sink's readiness line is fine."""
        ready = {check.name: check.ok for check in self.readiness()}
        out.add(
            PREFIX + "sink_up",
            "gauge",
            "1 when the sink's last health check passed and its deliveries are not failing.",
            [({"sink": s.name}, int(ready.get(f"sink:{s.name}", False))) for s in self._sinks],
        )
