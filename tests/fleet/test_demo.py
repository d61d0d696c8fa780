"""`maintenance-bridge demo --fleet` plays its fleet to the end and shows what the fleet saw."""

from __future__ import annotations

import pytest

from tests.test_cli import bridge

pytestmark = pytest.mark.slow


def test_the_fleet_demo_runs_five_vms_into_the_fleet_service() -> None:
    done = bridge("demo", "--fleet", "--speed", "20", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "fleet service at http://127.0.0.1:" in done.stderr
    assert "/v1/fleet/eligible?instance=web-1" in done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    assert ["total", "5"] in lines  # every VM reported
    assert ["reporting", "5"] in lines
    assert ["redeploy", "2"] in lines  # db-2 and db-3, an hour away
    assert ["rejected", "0"] in lines
