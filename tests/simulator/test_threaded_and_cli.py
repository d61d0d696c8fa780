"""SimulatorThread's thread-safe proxies and the CLI as a real subprocess."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import requests

from bridge.simulator import SimulatorThread

ROOT = Path(__file__).resolve().parents[2]


def test_thread_proxies_reads_writes_and_calls() -> None:
    with SimulatorThread(provider="both", speed=10) as sim:
        sim.gce.quirks.upcoming_none = "503"
        assert sim.gce.quirks.upcoming_none == "503"
        r = requests.get(
            sim.gce_url + "instance/upcoming-maintenance",
            headers={"Metadata-Flavor": "Google"},
            timeout=5,
        )
        assert r.status_code == 503
        event_id = sim.azure.add_event(event_type="Preempt", not_before_in=30)
        assert sim.azure.events[0]["EventId"] == event_id
        sim.clock.advance(30)
        assert sim.azure.events[0]["EventStatus"] == "Started"
        sim.faults.set(provider="gce", status_burst=(503, 1))
        assert sim.faults.gce.status_burst == (503, 1)
        assert sim.gce_host == sim.base_url.removeprefix("http://")
        assert sim.identity.gce.instance_name == "sim-vm-1"


def _start_cli(*args: str) -> subprocess.Popen[str]:
    """`python -m bridge.simulator`: the simulator's own program, without the main CLI."""
    return subprocess.Popen(
        [sys.executable, "-m", "bridge.simulator", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.posix  # SIGTERM/SIGINT to a child process
def test_cli_serves_logs_steps_and_exits_cleanly_on_sigint() -> None:
    proc = _start_cli("--port", "0", "--provider", "azure", "--scenario", "azure-spot-preempt",
                      "--speed", "100")  # fmt: skip
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "Started" in line:  # the Preempt reached NotBefore (35 sim s = 0.35 s)
                break
        text = "".join(lines)
        base = re.search(r"(http://127\.0\.0\.1:\d+)/_sim/state", text)
        assert base, text
        assert "source.azure.imds_url" in text
        assert "azure.add" in text
        with urllib.request.urlopen(base.group(1) + "/_sim/state", timeout=5) as resp:  # noqa: S310
            assert json.load(resp)["scenario"] == "azure-spot-preempt"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        assert "simulator stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.posix  # SIGTERM/SIGINT to a child process
def test_cli_sigterm_and_gce_banner() -> None:
    proc = _start_cli("--port", "0", "--provider", "gce")
    try:
        assert proc.stdout is not None
        text = "".join(proc.stdout.readline() for _ in range(5))
        assert "GCE_METADATA_HOST=127.0.0.1:" in text
        assert "source.gce.metadata_url" in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_list_scenarios_and_errors() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bridge.simulator", "--list-scenarios"],
        cwd=ROOT, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert "gce-live-migration" in out.stdout
    assert "azure-freeze" in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "bridge.simulator", "--scenario", "nope", "--port", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "unknown scenario" in bad.stderr
