"""deploy/grafana/maintenance-fleet.json asks only for metrics the code really exports.

A dashboard whose query names a metric nobody exports draws "No data" forever, silently.
So the metric names and labels are taken from real scrapes, not from a list: a running
sidecar (real bridge on the simulator, its listener's `/metrics`) and a running fleet
service (fed through `POST /v1/events`, its `/metrics`). Every query's metrics must be among
the exported ones, every label it selects or groups by must be one they carry (or one
Prometheus adds to every target: `instance`, `job`; or `le` of a histogram's buckets).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Final

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bridge.actions.coordination import budget
from bridge.actions.coordination.settings import Coordination
from bridge.infra.prometheus import Exposition
from bridge.infra.validation import validate
from bridge.simulator import Simulator
from tests.fleet.conftest import FleetFactory
from tests.fleet.world import FLEET
from tests.support import eventually
from tests.test_observability import observed

DASHBOARD: Final = Path(__file__).resolve().parents[2] / "deploy/grafana/maintenance-fleet.json"
#: Labels Prometheus attaches to every scraped series, and a histogram bucket's bound.
TARGET_LABELS: Final = {"instance", "job", "le"}
#: PromQL's aggregations, functions and keywords that look like names.
PROMQL: Final = {
    "sum",
    "max",
    "min",
    "avg",
    "count",
    "rate",
    "increase",
    "histogram_quantile",
    "by",
    "without",
    "and",
    "or",
    "unless",
    "on",
    "ignoring",
    "bool",
    "offset",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{([^}]*)\}")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def parse(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) a PromQL expression uses."""
    text = _STRING.sub('""', expr)
    labels = set()
    for matchers in _MATCHERS.findall(text):
        labels.update(_NAME.findall(re.sub(r'(=~|!~|!=|=)\s*""', "", matchers)))
    for grouping in _GROUPING.findall(text):
        labels.update(_NAME.findall(grouping))
    text = _RANGE.sub("", _GROUPING.sub("", _MATCHERS.sub("", text)))
    names = {
        match.group()
        for match in _NAME.finditer(text)
        if match.group() not in PROMQL and not text[match.end() :].lstrip().startswith("(")
    }
    return names, labels


def exported(text: str) -> dict[str, set[str]]:
    """Every series name an exposition declares (`# TYPE`; a histogram's three series) and
    the labels its samples carry."""
    found: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
            for suffix in suffixes:
                found.setdefault(name + suffix, set())
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", ())
    ]


def budget_scrape() -> str:
    """The maintenance budget's figures as a sidecar with coordination exports them. Only the
    names and labels are wanted here, so the budget is built on an etcd client that is never
    called (tests/test_coordination.py scrapes them from a budget at work on a real etcd)."""
    settings = validate(Coordination, {"endpoints": ["http://127.0.0.1:9"]})
    out = Exposition()
    budget.build(settings).export(out)
    return out.text()


async def exported_metrics(
    gce_sim: Simulator, tmp_path: Path, fleet_service: FleetFactory
) -> dict[str, set[str]]:
    """Every metric a sidecar (with its budget) and a fleet service export, with its labels,
    from real scrapes."""
    # Two 503s first, so the error counter has samples (and labels) to check.
    gce_sim.faults.set(provider="gce", status_burst=(503, 2))
    async with observed(gce_sim, tmp_path / "sidecar") as (running, client):
        gce_sim.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
        await running.wait_for(1)
        sidecar = (await client.get("/metrics")).text
    async with fleet_service() as service, httpx.AsyncClient(base_url=service.url) as http:
        batch = b"[" + b",".join(FLEET) + b"]"
        headers = {"content-type": "application/cloudevents-batch+json"}
        assert (await http.post("/v1/events", content=batch, headers=headers)).is_success

        async def counted() -> bool:
            return "fleet_notices_in_force{" in (await http.get("/metrics")).text

        await eventually(counted)
        fleet = (await http.get("/metrics")).text
    metrics = {**exported(sidecar), **exported(fleet), **exported(budget_scrape())}
    assert "maintenance_bridge_spool_pending" in metrics  # both scrapes were read
    assert "cause" in metrics["maintenance_bridge_metadata_errors_total"]
    assert "fleet_ingest_lag_seconds_bucket" in metrics
    return metrics


async def test_every_query_names_an_exported_metric(
    gce_sim: Simulator, tmp_path: Path, fleet_service: FleetFactory
) -> None:
    metrics = await exported_metrics(gce_sim, tmp_path, fleet_service)
    dashboard = json.loads(DASHBOARD.read_text())
    found = queries(dashboard)
    assert len(found) >= 10
    for title, expr in found:
        names, labels = parse(expr)
        assert names, f"{title}: {expr} names no metric"
        for name in names:
            assert name in metrics, f"{title}: {name} is not exported by the code"
        carried = set().union(*(metrics[name] for name in names)) | TARGET_LABELS
        assert labels <= carried, f"{title}: {expr} uses labels {labels - carried}"


def test_the_dashboard_covers_what_the_issue_asks_for() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    everything = " ".join(expr for _, expr in queries(dashboard))
    for needed in (
        "sum by (zone, kind) (fleet_notices_in_force)",  # notices in force by zone and kind
        'fleet_instances{state="silent"}',  # silent instances
        "fleet_ingest_lag_seconds_bucket",  # ingest lag
        "maintenance_bridge_events_retried_total",  # delivery failures per sidecar
        "maintenance_bridge_events_dead_lettered_total",
        "maintenance_bridge_spool_pending",  # spool depth per sidecar
    ):
        assert needed in everything, needed
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        place = panel["gridPos"]
        assert place["x"] + place["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_the_promql_reader() -> None:
    assert parse('sum by (zone, kind) (fleet_notices_in_force{status="started"})') == (
        {"fleet_notices_in_force"},
        {"zone", "kind", "status"},
    )
    assert parse("histogram_quantile(0.95, sum by (le) (rate(x_bucket[5m])))") == (
        {"x_bucket"},
        {"le"},
    )
    assert parse("a_metric == 0") == ({"a_metric"}, set())
