"""deploy/prometheus/: the alerting rules of both halves, checked and unit-tested by promtool,
naming only metrics the code exports, each linking to the Grafana panel that shows its cause.

promtool is Debian's `prometheus` package: installed by the set-up when missing (as root),
otherwise the tests skip on a laptop and fail under `CI=true` (tests/debian_tool.py).
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bridge.simulator import Simulator
from tests.debian_tool import debian_tool
from tests.fleet.conftest import FleetFactory
from tests.fleet.test_grafana import DASHBOARD, TARGET_LABELS, exported_metrics, parse, queries

PROMETHEUS: Final = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES: Final = PROMETHEUS / "maintenance-bridge.rules.yml"
RULE_TESTS: Final = PROMETHEUS / "maintenance-bridge.rules.test.yml"


def alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def promtool(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    tool = debian_tool("promtool", "prometheus")
    return subprocess.run(
        [tool, *map(str, argv)], capture_output=True, text=True, timeout=120, cwd=PROMETHEUS
    )


def test_promtool_checks_the_rules() -> None:
    result = promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout


def test_promtool_unit_tests_pass_and_cover_every_alert_quiet_and_firing() -> None:
    result = promtool("test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    covered: dict[str, set[bool]] = {}
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            covered.setdefault(check["alertname"], set()).add(bool(check["exp_alerts"]))
    assert covered == {rule["alert"]: {False, True} for rule in alerts()}


def test_the_alerts_cover_what_operators_page_on() -> None:
    names = {rule["alert"] for rule in alerts()}
    assert names >= {
        "MaintenanceSidecarSilent",
        "MaintenanceSidecarSpoolGrowing",
        "MaintenanceSidecarDeadLetters",
        "FleetSourceBehind",
        "FleetSourceStopped",
        "FleetRejectedInputRising",
        "MaintenanceBudgetExhausted",
        "FleetStoreFailing",
    }
    for rule in alerts():
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert {"summary", "description", "dashboard"} <= set(rule["annotations"]), rule["alert"]


def test_every_alert_links_the_panel_that_shows_its_cause() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = {panel["id"]: panel for panel in dashboard["panels"] if panel["type"] != "row"}
    for rule in alerts():
        link = rule["annotations"]["dashboard"]
        match = re.fullmatch(rf"/d/{dashboard['uid']}/[\w-]+\?viewPanel=(\d+)", link)
        assert match, f"{rule['alert']}: {link}"
        panel = panels.get(int(match[1]))
        assert panel is not None, f"{rule['alert']} links panel {match[1]}, not on the dashboard"
        shown = set().union(*(parse(expr)[0] for _, expr in queries({"panels": [panel]})))
        assert parse(rule["expr"])[0] & shown, f"{rule['alert']}: {panel['title']} shows another"


async def test_every_alert_names_exported_metrics_and_labels(
    gce_sim: Simulator, tmp_path: Path, fleet_service: FleetFactory
) -> None:
    metrics = await exported_metrics(gce_sim, tmp_path, fleet_service)
    for rule in alerts():
        names, labels = parse(rule["expr"])
        assert names, rule["alert"]
        for name in names:
            assert name in metrics, f"{rule['alert']}: {name} is not exported by the code"
        carried = set().union(*(metrics[name] for name in names)) | TARGET_LABELS
        assert labels <= carried, f"{rule['alert']}: labels {labels - carried}"
        templated = set(re.findall(r"\$labels\.(\w+)", json.dumps(rule["annotations"])))
        assert templated <= carried, f"{rule['alert']}: annotations use {templated - carried}"


def scrape(text: str) -> dict[str, float]:
    return {
        sample.name + json.dumps(sample.labels, sort_keys=True): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_a_failing_store_turns_fleet_store_up_to_zero_and_the_scrape_goes_on(
    fleet_service: FleetFactory, tmp_path: Path
) -> None:
    async with fleet_service() as service, httpx.AsyncClient(base_url=service.url) as http:
        up = scrape((await http.get("/metrics")).text)
        assert up["fleet_store_up{}"] == 1
        assert up['fleet_source_up{"source": "http"}'] == 1
        # The store loses its tables of notices and of kept counts under the service (a real
        # SQLite error on every read of them).
        with sqlite3.connect(tmp_path / "fleet.sqlite3") as db:
            db.execute("ALTER TABLE notices RENAME TO notices_gone")
            db.execute("ALTER TABLE tallies RENAME TO tallies_gone")
        answer = await http.get("/metrics")
        assert answer.status_code == 200
        down = scrape(answer.text)
        assert down["fleet_store_up{}"] == 0
        assert down['fleet_source_up{"source": "http"}'] == 1
        assert 'fleet_ingest_events_total{"outcome": "invalid", "source": "http"}' in down
        assert not [key for key in down if key.startswith("fleet_notices_in_force")]
        with sqlite3.connect(tmp_path / "fleet.sqlite3") as db:
            db.execute("ALTER TABLE notices_gone RENAME TO notices")
            db.execute("ALTER TABLE tallies_gone RENAME TO tallies")
        assert scrape((await http.get("/metrics")).text)["fleet_store_up{}"] == 1


@pytest.mark.parametrize("name", ["fleet_store_up", "fleet_source_up"])
def test_the_dashboard_shows_the_new_figures(name: str) -> None:
    everything = " ".join(expr for _, expr in queries(json.loads(DASHBOARD.read_text())))
    assert name in everything
