"""What `/metrics` exposes: every figure read from where the bridge already keeps it.

Each component renders its own figures (`Supervision.export`: the notices and the watchers'
metadata requests; `Dispatcher.export`, `Spool.export`, `Actions.export` with
`Budget.export`, `SinkChecks.export`), handed over as `bridge.runner.Observed`'s exporters in
a fixed order; this module adds the version and the process figures and puts them in one
exposition. It never reaches through the bridge.

Names follow Prometheus conventions (`_total` counters, base units, one prefix). Counters
are per process: a restart resets them, which Prometheus' `rate()` and `increase()` handle.
The spool gauges come from the spool itself, so they are right across restarts too.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

from bridge.infra import platform
from bridge.infra.buildinfo import version
from bridge.infra.prometheus import PREFIX as PREFIX
from bridge.infra.prometheus import Exposition

if TYPE_CHECKING:
    from bridge.surface.health import HealthMonitor

_STARTED: Final = time.time()


def _process(out: Exposition) -> None:
    """The standard process figures, from `bridge.infra.platform` (a figure it lacks: left out)."""
    figures = platform.current().process_figures()
    if figures is not None:
        out.add(
            "process_cpu_seconds_total",
            "counter",
            "User and system CPU time spent, in seconds.",
            [({}, figures.cpu_seconds)],
        )
    if figures is not None and figures.resident_bytes is not None:
        out.add(
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size.",
            [({}, figures.resident_bytes)],
        )
    out.add(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since the Unix epoch.",
        [({}, _STARTED)],
    )


async def render(monitor: HealthMonitor) -> str:
    """The text exposition of the bridge's state right now."""
    out = Exposition()
    observed = monitor.observed
    providers = observed.providers if observed else ()
    build = version()
    out.add(
        PREFIX + "info",
        "gauge",
        "Always 1; the labels say which version watches which provider.",
        [({"version": build, "provider": p, "phase": monitor.phase}, 1) for p in providers]
        or [({"version": build, "provider": "", "phase": monitor.phase}, 1)],
    )
    _process(out)
    if observed is None:
        return out.text()
    for exporter in observed.exporters:
        pending = exporter.export(out)
        if pending is not None:  # the spool reads SQLite
            await pending
    return out.text()
