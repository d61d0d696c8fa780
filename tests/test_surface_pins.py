"""The operator surface's exact shape: every `/metrics` family (name, type, help text, label
names, in order) and every `/healthz` and `/readyz` check name, in order.

Dashboards, alerts and probes are written against these; a refactoring of who computes a
figure must not change a line of them. Real parts: the bridge watching all three simulated
clouds, its SQLite spool and dispatcher, the listener on a loopback port, httpx as the
scraper and Prometheus' own parser.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bridge.config import Listener as ListenerSettings
from bridge.simulator import Simulator
from bridge.surface.health import HealthMonitor
from bridge.surface.routes import serving
from tests.support import eventually, running_bridge

P = "maintenance_bridge_"

#: (name, type, help) of every family, in the order `/metrics` lists them (no coordination
#: configured, so the budget's families are absent; `tests/test_coordination.py` has them).
FAMILIES = [
    (P + "info", "gauge", "Always 1; the labels say which version watches which provider."),
    ("process_cpu_seconds_total", "counter", "User and system CPU time spent, in seconds."),
    ("process_resident_memory_bytes", "gauge", "Resident memory size."),
    ("process_start_time_seconds", "gauge", "Start time of the process since the Unix epoch."),
    (
        P + "notices_total",
        "counter",
        "Notices seen (each is one CloudEvent), by provider, kind and status.",
    ),
    (
        P + "metadata_requests_total",
        "counter",
        "Requests made to the metadata service, answered or not.",
    ),
    (
        P + "metadata_errors_total",
        "counter",
        "Failed metadata requests by cause: an HTTP status, timeout, connection, redirect, "
        "missing-vendor-header or malformed.",
    ),
    (
        P + "metadata_skipped_total",
        "counter",
        "Events or fields of metadata documents that could not be read and were left out.",
    ),
    (P + "metadata_up", "gauge", "1 when the last metadata request succeeded."),
    (
        P + "metadata_last_success_timestamp_seconds",
        "gauge",
        "When the metadata service last answered usefully (Unix time).",
    ),
    (
        P + "metadata_request_duration_seconds",
        "histogram",
        "Duration of metadata requests, long polls included (GCE waits up to its timeout).",
    ),
    (P + "events_delivered_total", "counter", "Events the sink acknowledged."),
    (P + "events_retried_total", "counter", "Failed delivery attempts that will be retried."),
    (P + "events_dead_lettered_total", "counter", "Events the sink rejected for good."),
    (
        P + "spool_overflowed_total",
        "counter",
        "Events moved to the dead letters because the sink's queue hit delivery.max_pending.",
    ),
    (P + "spool_pending", "gauge", "Events spooled and not yet delivered, per sink."),
    (
        P + "spool_oldest_pending_age_seconds",
        "gauge",
        "Age of the oldest undelivered event per sink (0 when none is waiting).",
    ),
    (
        P + "hook_runs_total",
        "counter",
        "Hook runs by hook and outcome (succeeded, failed, timed-out, skipped, interrupted).",
    ),
    (
        P + "approvals_total",
        "counter",
        "Azure approval decisions by rule and result (approved, rejected, held, withdrawn).",
    ),
    (
        P + "sink_up",
        "gauge",
        "1 when the sink's last health check passed and its deliveries are not failing.",
    ),
]

#: The label names of each sample name (a histogram's buckets add `le`).
LABELS = {
    P + "info": {"version", "provider", "phase"},
    "process_cpu_seconds_total": set(),
    "process_resident_memory_bytes": set(),
    "process_start_time_seconds": set(),
    P + "notices_total": {"provider", "kind", "status"},
    P + "metadata_requests_total": {"provider"},
    P + "metadata_errors_total": {"provider", "cause"},
    P + "metadata_skipped_total": {"provider"},
    P + "metadata_up": {"provider"},
    P + "metadata_last_success_timestamp_seconds": {"provider"},
    P + "metadata_request_duration_seconds_bucket": {"provider", "le"},
    P + "metadata_request_duration_seconds_sum": {"provider"},
    P + "metadata_request_duration_seconds_count": {"provider"},
    P + "events_delivered_total": {"sink"},
    P + "events_retried_total": {"sink"},
    P + "events_dead_lettered_total": {"sink"},
    P + "spool_overflowed_total": {"sink"},
    P + "spool_pending": {"sink"},
    P + "spool_oldest_pending_age_seconds": {"sink"},
    P + "hook_runs_total": {"hook", "outcome"},
    P + "approvals_total": {"rule", "result"},
    P + "sink_up": {"sink"},
}

LIVENESS = ["process", "watcher:aws", "watcher:azure", "watcher:gce", "spool"]
READINESS = [
    "metadata:aws",
    "metadata:azure",
    "metadata:gce",
    "metadata:gce:instance/maintenance-event",
    "metadata:gce:instance/preempted",
    "metadata:gce:instance/upcoming-maintenance",
    "spool",
    "sink:memory",
]


def _families(text: str) -> list[tuple[str, str, str]]:
    found = []
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line.removeprefix("# HELP ").partition(" ")
            found.append((name, help_text))
        elif line.startswith("# TYPE "):
            name, _, kind = line.removeprefix("# TYPE ").partition(" ")
            assert found[-1][0] == name
            found[-1] = (name, kind, found[-1][1])  # type: ignore[assignment]
    return found  # type: ignore[return-value]


async def test_metrics_health_and_readiness_keep_their_exact_shape(tmp_path: Path) -> None:
    async with Simulator(provider="all") as sim:
        sim.faults.set(provider="azure", rate_limit=False)
        async with running_bridge(sim, tmp_path, ("aws", "azure", "gce")) as run:
            monitor = HealthMonitor(sink_check_interval=0.1)
            monitor.attach(run.bridge)
            checks = asyncio.create_task(monitor.run_sink_checks())
            try:
                async with serving(ListenerSettings(port=0), monitor) as listener:
                    assert listener is not None
                    async with httpx.AsyncClient(base_url=listener.url) as client:

                        async def ready() -> bool:
                            return (await client.get("/readyz")).status_code == 200

                        await eventually(ready)
                        sim.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
                        await run.wait_for(1)
                        metrics = (await client.get("/metrics")).text
                        healthz = (await client.get("/healthz")).json()
                        readyz = (await client.get("/readyz")).json()
            finally:
                checks.cancel()

    assert _families(metrics) == FAMILIES
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            assert set(sample.labels) == LABELS[sample.name], sample.name
    sampled = {s.name for f in text_string_to_metric_families(metrics) for s in f.samples}
    # Every family that has something to count by now shows a sample.
    assert sampled >= set(LABELS) - {
        P + "metadata_errors_total",
        P + "hook_runs_total",
        P + "approvals_total",
    }
    assert [c["name"] for c in healthz["checks"]] == LIVENESS
    assert [c["name"] for c in readyz["checks"]] == READINESS
    assert healthz["status"] == readyz["status"] == "ok"
