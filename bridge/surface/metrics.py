"""What `/metrics` exposes: every figure read from where the bridge already keeps it.

Names follow Prometheus conventions (`_total` counters, base units, one prefix). Counters
are per process: a restart resets them, which Prometheus' `rate()` and `increase()` handle.
The spool gauges come from the spool itself, so they are right across restarts too.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

from bridge import __version__
from bridge.infra import platform
from bridge.infra.prometheus import Exposition
from bridge.pipeline.spool import SpoolError

if TYPE_CHECKING:
    from bridge.actions.coordination.budget import Budget
    from bridge.surface.health import HealthMonitor

PREFIX: Final = "maintenance_bridge_"
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
    stats = bridge.dispatcher.stats
    for metric, attribute, help_text in (
        ("events_delivered_total", "delivered", "Events the sink acknowledged."),
        ("events_retried_total", "retried", "Failed delivery attempts that will be retried."),
        ("events_dead_lettered_total", "dead_lettered", "Events the sink rejected for good."),
    ):
        out.add(
            PREFIX + metric,
            "counter",
            help_text,
            [({"sink": name}, getattr(stats[name], attribute)) for name in sink_names],
        )
    out.add(
        PREFIX + "spool_overflowed_total",
        "counter",
        "Events moved to the dead letters because the sink's queue hit delivery.max_pending.",
        [({"sink": name}, bridge.spool.overflowed.get(name, 0)) for name in sink_names],
    )
    try:
        depth = await bridge.spool.depth()
    except SpoolError:  # /readyz says why; the other figures are still worth having
        depth = {}
    now = time.time()
    out.add(
        PREFIX + "spool_pending",
        "gauge",
        "Events spooled and not yet delivered, per sink.",
        [({"sink": name}, depth.get(name, (0, None))[0]) for name in sink_names],
    )
    out.add(
        PREFIX + "spool_oldest_pending_age_seconds",
        "gauge",
        "Age of the oldest undelivered event per sink (0 when none is waiting).",
        [
            (
                {"sink": name},
                max(0.0, now - oldest) if (oldest := depth.get(name, (0, None))[1]) else 0,
            )
            for name in sink_names
        ],
    )
    out.add(
        PREFIX + "hook_runs_total",
        "counter",
        "Hook runs by hook and outcome (succeeded, failed, timed-out, skipped, interrupted).",
        [
            ({"hook": hook, "outcome": outcome}, n)
            for (hook, outcome), n in sorted(bridge.actions.hook_runs.items())
        ],
    )
    out.add(
        PREFIX + "approvals_total",
        "counter",
        "Azure approval decisions by rule and result (approved, rejected, held, withdrawn).",
        [
            ({"rule": rule, "result": result}, n)
            for (rule, result), n in sorted(bridge.actions.approvals.items())
        ],
    )
    if bridge.actions.budget is not None:
        _coordination(out, bridge.actions.budget)
    readiness = {check.name: check.ok for check in monitor.readiness()}
    out.add(
        PREFIX + "sink_up",
        "gauge",
        "1 when the sink's last health check passed and its deliveries are not failing.",
        [({"sink": name}, 1 if readiness.get(f"sink:{name}", False) else 0) for name in sink_names],
    )
    return out.text()


def _coordination(out: Exposition, budget: Budget) -> None:
    """The maintenance budget (actions/coordination): slots, waits, timeouts, engine health."""
    out.add(
        PREFIX + "coordination_slots_held",
        "gauge",
        "Budget slots this VM holds now (one per group, however many notices share it).",
        [({}, budget.held)],
    )
    out.add(
        PREFIX + "coordination_waiting",
        "gauge",
        "Disruptive actions waiting for a budget slot now.",
        [({}, budget.waiting)],
    )
    out.add(
        PREFIX + "coordination_takes_total",
        "counter",
        "Attempts to take a slot by action and outcome (acquired, timed-out, unavailable, "
        "withdrawn).",
        [({"action": a, "outcome": o}, n) for (a, o), n in sorted(budget.takes.items())],
    )
    out.add(
        PREFIX + "coordination_waits_total",
        "counter",
        "Slot takes that had to wait, by action.",
        [({"action": a}, n) for a, n in sorted(budget.waits.items())],
    )
    out.add(
        PREFIX + "coordination_wait_seconds_total",
        "counter",
        "Seconds spent waiting for a slot, by action.",
        [({"action": a}, s) for a, s in sorted(budget.wait_seconds.items())],
    )
    out.add(
        PREFIX + "coordination_timeouts_total",
        "counter",
        "Slot takes that reached their deadline without a slot.",
        [({}, sum(n for (_, o), n in budget.takes.items() if o == "timed-out"))],
    )
    out.add(
        PREFIX + "coordination_engine_errors_total",
        "counter",
        "Failed calls to the coordination engine (etcd unreachable or refusing).",
        [({}, budget.unavailable)],
    )
    out.add(
        PREFIX + "coordination_slots_lost_total",
        "counter",
        "Held slots found gone (the lease expired while etcd could not be reached) and not "
        "taken back because others held the whole budget.",
        [({}, budget.backend.lost)],
    )
    contact = budget.last_contact
    out.add(
        PREFIX + "coordination_up",
        "gauge",
        "1 when the coordination engine answered the last call.",
        [({}, 1 if contact is not None and contact[0] else 0)],
    )
