"""`/metrics`, `/healthz` and `/readyz` of a real bridge watching the simulator.

Real parts: the bridge (watchers, SQLite spool, dispatcher), the in-process simulator with
its fault switches, the listener on a loopback port, httpx as the scraper, and Prometheus'
own parser for the text format. The sink is the official in-memory fake, whose health
answer the test sets (no real sink can be made unhealthy on demand here).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bridge.actions.audit import APPROVED
from bridge.config import Listener as ListenerSettings
from bridge.runner import ProviderName
from bridge.simulator import Simulator
from bridge.sinkapi import Health
from bridge.surface.health import HealthMonitor
from bridge.surface.listener import Listener
from bridge.surface.routes import serving
from tests.support import CheckedSink, Running, eventually, running_bridge


class SwitchableSink(CheckedSink):
    """The in-memory sink, whose health check answers what the test says."""

    health = Health(True, "fine")

    async def healthcheck(self) -> Health:
        return self.health


@asynccontextmanager
async def observed(
    sim: Simulator,
    state_dir: Path,
    sink: CheckedSink | None = None,
    providers: tuple[ProviderName, ...] = ("gce",),
    settings: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[Running, httpx.AsyncClient]]:
    async with running_bridge(sim, state_dir, providers, sink=sink, settings=settings) as running:
        monitor = HealthMonitor(sink_check_interval=0.1)
        monitor.attach(running.bridge)
        checks = asyncio.create_task(monitor.run_sink_checks())
        try:
            async with serving(ListenerSettings(port=0), monitor) as listener:
                assert isinstance(listener, Listener)
                async with httpx.AsyncClient(base_url=listener.url) as client:
                    yield running, client
        finally:
            checks.cancel()


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape, keyed by name and label set (parsed by Prometheus' parser)."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(
    scrape: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return scrape.get((name, frozenset(labels.items())), 0.0)


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return samples(response.text)


async def test_counters_move_as_a_scenario_plays(gce_sim: Simulator, tmp_path: Path) -> None:
    async with observed(gce_sim, tmp_path) as (running, client):
        await eventually(lambda: _status(client, "/readyz", 200))
        before = await scrape(client)
        assert (
            value(
                before,
                "maintenance_bridge_notices_total",
                provider="gce",
                kind="live-migrate",
                status="started",
            )
            == 0
        )

        gce_sim.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
        await running.wait_for(1)
        gce_sim.gce.set("instance/maintenance-event", "NONE")
        await running.wait_for(2)

        async def acknowledged() -> bool:
            # The sink holds the event a moment before the dispatcher records the ack.
            scraped = await scrape(client)
            return value(scraped, "maintenance_bridge_events_delivered_total", sink="memory") == 2

        await eventually(acknowledged)
        after = await scrape(client)

    for status in ("started", "completed"):
        assert (
            value(
                after,
                "maintenance_bridge_notices_total",
                provider="gce",
                kind="live-migrate",
                status=status,
            )
            == 1
        )
    assert value(after, "maintenance_bridge_events_delivered_total", sink="memory") == 2
    assert value(after, "maintenance_bridge_spool_pending", sink="memory") == 0
    assert value(after, "maintenance_bridge_spool_oldest_pending_age_seconds", sink="memory") == 0
    requests_before = value(before, "maintenance_bridge_metadata_requests_total", provider="gce")
    requests_after = value(after, "maintenance_bridge_metadata_requests_total", provider="gce")
    assert requests_after > requests_before > 0
    # Durations are observed when a request ends; the long polls under way are not counted yet.
    durations = value(
        after, "maintenance_bridge_metadata_request_duration_seconds_count", provider="gce"
    )
    assert 0 < durations <= requests_after
    assert value(after, "maintenance_bridge_metadata_up", provider="gce") == 1
    assert value(after, "maintenance_bridge_sink_up", sink="memory") == 1
    assert value(after, "process_resident_memory_bytes") > 10_000_000


async def _status(client: httpx.AsyncClient, path: str, expected: int) -> bool:
    return (await client.get(path)).status_code == expected


async def test_readyz_fails_while_the_metadata_server_is_down_and_recovers(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    async with observed(gce_sim, tmp_path) as (_running, client):
        await eventually(lambda: _status(client, "/readyz", 200))

        gce_sim.faults.set(provider="gce", status_burst=(503, 1_000_000))
        await eventually(lambda: _status(client, "/readyz", 503))
        report = (await client.get("/readyz")).json()
        failing = [c for c in report["checks"] if not c["ok"]]
        assert failing[0]["name"] == "metadata:gce"
        assert all(c["name"].startswith("metadata:gce") for c in failing)  # and its keys
        assert "503" in failing[0]["detail"]
        # A metadata outage is not a reason to restart the process: liveness stays green.
        assert (await client.get("/healthz")).status_code == 200
        errors = await scrape(client)
        assert (
            value(errors, "maintenance_bridge_metadata_errors_total", provider="gce", cause="503")
            > 0
        )
        assert value(errors, "maintenance_bridge_metadata_up", provider="gce") == 0

        gce_sim.faults.clear(provider="gce")
        await eventually(lambda: _status(client, "/readyz", 200))


async def test_readyz_reports_an_unhealthy_sink_and_a_failing_delivery(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    from bridge.sinkapi import Retry

    sink = SwitchableSink("memory")
    async with observed(gce_sim, tmp_path, sink) as (running, client):
        await eventually(lambda: _status(client, "/readyz", 200))

        sink.health = Health(False, "401 from the receiver: check the token")
        await eventually(lambda: _status(client, "/readyz", 503))
        checks = (await client.get("/readyz")).json()["checks"]
        assert {
            "name": "sink:memory",
            "ok": False,
            "detail": "401 from the receiver: check the token",
        } in checks

        sink.health = Health(True, "fine")
        await eventually(lambda: _status(client, "/readyz", 200))

        sink.fail_next(*[Retry("receiver down")] * 30)
        gce_sim.gce.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
        await eventually(lambda: _status(client, "/readyz", 503))
        detail = {c["name"]: c["detail"] for c in (await client.get("/readyz")).json()["checks"]}
        assert "receiver down" in detail["sink:memory"]
        pending = await scrape(client)
        assert value(pending, "maintenance_bridge_spool_pending", sink="memory") == 1
        assert value(pending, "maintenance_bridge_events_retried_total", sink="memory") > 0

        await running.wait_for(1, timeout=15)
        await eventually(lambda: _status(client, "/readyz", 200))


async def test_healthz_and_readyz_explain_themselves_before_the_cloud_is_known() -> None:
    monitor = HealthMonitor()
    monitor.phase = "detecting"
    async with serving(ListenerSettings(port=0), monitor) as listener:
        assert listener is not None
        async with httpx.AsyncClient(base_url=listener.url) as client:
            healthz = await client.get("/healthz")
            readyz = await client.get("/readyz")
            metrics = await client.get("/metrics")
    assert healthz.status_code == 200
    assert readyz.status_code == 503
    assert "no cloud detected yet" in readyz.json()["checks"][0]["detail"]
    assert (
        value(
            samples(metrics.text),
            "maintenance_bridge_info",
            version=_version(),
            provider="",
            phase="detecting",
        )
        == 1
    )


def _version() -> str:
    from bridge.infra.buildinfo import version

    return version()  # the build's version: the release and its commit


async def test_a_disabled_listener_serves_nothing() -> None:
    async with serving(ListenerSettings(enabled=False), HealthMonitor()) as listener:
        assert listener is None


async def test_hook_runs_and_approvals_are_counted(azure_sim: Simulator, tmp_path: Path) -> None:
    settings = {
        "hooks": [{"name": "drain", "command": [sys.executable, "-c", "pass"]}],
        "approval": {"rules": [{"event_types": ["Reboot"], "action": "approve-after-hooks"}]},
    }
    async with observed(azure_sim, tmp_path, providers=("azure",), settings=settings) as (
        running,
        client,
    ):
        azure_sim.azure.add_event(event_type="Reboot")
        await running.sink.wait_for_type(APPROVED)
        scraped = await scrape(client)
    assert (
        value(scraped, "maintenance_bridge_hook_runs_total", hook="drain", outcome="succeeded") == 1
    )
    approvals = value(
        scraped, "maintenance_bridge_approvals_total", rule="approval.rules[0]", result="approved"
    )
    assert approvals == 1
