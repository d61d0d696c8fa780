"""What `/metrics` exposes: every figure read from where the bridge already keeps it.

Each component renders its own figures (`Dispatcher.export`, `Spool.export`,
`Actions.export`, `Budget.export`); this module adds the process, the notices and the
watchers' metadata figures and puts them in one exposition, in a fixed order.

Names follow Prometheus conventions (`_total` counters, base units, one prefix). Counters
are per process: a restart resets them, which Prometheus' `rate()` and `increase()` handle.
The spool gauges come from the spool itself, so they are right across restarts too.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

from bridge import __version__
from bridge.infra import platform
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
    bridge = monitor.bridge
    providers = sorted(bridge.factories) if bridge else []
    out.add(
        PREFIX + "info",
        "gauge",
        "Always 1; the labels say which version watches which provider.",
        [({"version": __version__, "provider": p, "phase": monitor.phase}, 1) for p in providers]
        or [({"version": __version__, "provider": "", "phase": monitor.phase}, 1)],
    )
    _process(out)
    if bridge is None:
        return out.text()

    out.add(
        PREFIX + "notices_total",
        "counter",
        "Notices seen (each is one CloudEvent), by provider, kind and status.",
        [
            ({"provider": p, "kind": k, "status": s}, n)
            for (p, k, s), n in sorted(bridge.notice_counts.items())
        ],
    )

    watchers = {name: bridge.watchers[name] for name in providers if name in bridge.watchers}
    out.add(
        PREFIX + "metadata_requests_total",
        "counter",
        "Requests made to the metadata service, answered or not.",
        [({"provider": name}, w.stats.requests) for name, w in watchers.items()],
    )
    out.add(
        PREFIX + "metadata_errors_total",
        "counter",
        "Failed metadata requests by cause: an HTTP status, timeout, connection, redirect, "
        "missing-vendor-header or malformed.",
        [
            ({"provider": name, "cause": cause}, count)
            for name, w in watchers.items()
            for cause, count in sorted(w.stats.errors.items())
        ],
    )
    out.add(
        PREFIX + "metadata_skipped_total",
        "counter",
        "Events or fields of metadata documents that could not be read and were left out.",
        [({"provider": name}, w.stats.skipped) for name, w in watchers.items()],
    )
    out.add(
        PREFIX + "metadata_up",
        "gauge",
        "1 when the last metadata request succeeded.",
        [({"provider": name}, 1 if w.healthy else 0) for name, w in watchers.items()],
    )
    out.add(
        PREFIX + "metadata_last_success_timestamp_seconds",
        "gauge",
        "When the metadata service last answered usefully (Unix time).",
        [
            ({"provider": name}, w.stats.last_success)
            for name, w in watchers.items()
            if w.stats.last_success is not None
        ],
    )
    out.add_histogram(
        PREFIX + "metadata_request_duration_seconds",
        "Duration of metadata requests, long polls included (GCE waits up to its timeout).",
        [({"provider": name}, w.stats.durations) for name, w in watchers.items()],
    )

    sink_names = [sink.name for sink in bridge.sinks]
    bridge.dispatcher.export(out)
    await bridge.spool.export(out)
    bridge.actions.export(out)
    readiness = {check.name: check.ok for check in monitor.readiness()}
    out.add(
        PREFIX + "sink_up",
        "gauge",
        "1 when the sink's last health check passed and its deliveries are not failing.",
        [({"sink": name}, 1 if readiness.get(f"sink:{name}", False) else 0) for name in sink_names],
    )
    return out.text()
