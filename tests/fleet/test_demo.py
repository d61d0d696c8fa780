"""`maintenance-bridge demo --fleet` plays its fleet, shows what the fleet saw, and keeps
serving the page until Ctrl-C (or ends with the scenarios under `--no-keep`)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.test_cli import bridge

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_the_fleet_demo_runs_five_vms_into_the_fleet_service() -> None:
    done = bridge("demo", "--fleet", "--speed", "20", "--no-keep", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "fleet service at http://127.0.0.1:" in done.stderr
    assert "/v1/fleet/eligible?instance=web-1" in done.stderr
    assert "scenario over" in done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    assert ["total", "5"] in lines  # every VM reported
    assert ["reporting", "5"] in lines
    assert ["redeploy", "2"] in lines  # db-2 and db-3, an hour away
    assert ["rejected", "0"] in lines
    assert ["attested", "5"] in lines  # the fleet requires identity: every VM enrolled
    assert ["unattested", "0"] in lines


@pytest.mark.posix  # SIGINT to a child process: what Ctrl-C sends
def test_the_fleet_demo_keeps_serving_until_ctrl_c_and_then_says_stopped() -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "bridge", "demo", "--fleet", "--speed", "20"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert child.stderr is not None
    try:
        seen = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = child.stderr.readline()
            seen.append(line)
            if "keeps serving at" in line or not line:
                break
        found = re.search(r"keeps serving at (http://\S+)/ ", seen[-1])
        assert found, "".join(seen)
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only
        with direct.open(f"{found[1]}/v1/fleet/summary", timeout=10) as answer:
            assert answer.status == 200
        with direct.open(f"{found[1]}/", timeout=10) as page:
            assert page.status == 200
        child.send_signal(signal.SIGINT)
        rest = child.stderr.read()
        assert child.wait(timeout=60) == 0, rest
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert "stopped" in rest.splitlines()
    assert "scenario over" not in rest
    assert "Traceback" not in rest
