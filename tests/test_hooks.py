"""Hooks: real child processes run by the real bridge for notices from the simulator.

Each hook here is a small Python program run with this interpreter (no shell), so the tests
see exactly what a hook sees: the event on stdin, `MB_*` variables, a timeout that kills the
process group, and at most one run per transition across restarts.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bridge.actions.audit import HOOK_COMPLETED
from bridge.runner import ProviderName
from bridge.simulator import Simulator
from tests.support import CheckedSink, alive, eventually, running_bridge

AZURE: tuple[ProviderName, ...] = ("azure",)
MIGRATE = "MIGRATE_ON_HOST_MAINTENANCE"

RECORD = """
import json, os, sys, time
out = sys.argv[1]
event = json.load(sys.stdin)
env = {k: v for k, v in os.environ.items() if k.startswith("MB_")}
with open(out, "a") as f:
    f.write(json.dumps({"event": event, "env": env, "at": time.monotonic()}) + "\\n")
print("recorded", event["data"]["status"])
"""


def python_hook(name: str, code: str, *args: str, **options: Any) -> dict[str, Any]:
    return {"name": name, "command": [sys.executable, "-c", code, *args], **options}


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_hook_gets_the_event_on_stdin_and_its_fields_in_the_environment(
    gce_sim: Simulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "record.jsonl"
    hooks = [python_hook("record", RECORD, str(out), statuses=["started"])]
    caplog.set_level(logging.INFO, logger="bridge.hooks")
    async with running_bridge(gce_sim, tmp_path, settings={"hooks": hooks}) as run:
        gce_sim.gce.set("instance/maintenance-event", MIGRATE)
        (completed,) = await run.sink.wait_for_type(HOOK_COMPLETED)
        started = run.sink.dicts()[0]
        gce_sim.gce.set("instance/maintenance-event", "NONE")
        await run.wait_for(3)
        assert len(await run.sink.wait_for_type(HOOK_COMPLETED)) == 1  # not for completed
    (seen,) = records(out)
    assert seen["event"] == started
    env = seen["env"]
    assert env["MB_EVENT_ID"] == started["id"]
    assert env["MB_EVENT_TYPE"] == "io.maintenancebridge.maintenance.started"
    assert env["MB_NOTICE_ID"] == started["data"]["notice_id"]
    assert (env["MB_PROVIDER"], env["MB_KIND"], env["MB_STATUS"]) == (
        "gce",
        "live-migrate",
        "started",
    )
    assert env["MB_INSTANCE"] == "sim-vm-1"
    assert env["MB_NOT_BEFORE"] == started["data"]["not_before"]
    assert env["MB_HOOK"] == "record"
    assert env["MB_DEADLINE"] == ""
    data = completed["data"]
    assert completed["subject"] == started["data"]["notice_id"]
    assert (data["hook"], data["outcome"], data["exit_code"]) == ("record", "succeeded", 0)
    assert data["event_id"] == started["id"]
    assert data["output_tail"] == "recorded started\n"
    assert "hook record: recorded started" in caplog.text


async def test_failing_and_missing_commands_are_reported(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    hooks = [
        python_hook("fails", "import sys; print('no disk'); sys.exit(3)"),
        {"name": "missing", "command": [str(tmp_path / "no-such-program")]},
    ]
    async with running_bridge(gce_sim, tmp_path, settings={"hooks": hooks}) as run:
        gce_sim.gce.set("instance/maintenance-event", MIGRATE)
        fails, missing = await run.sink.wait_for_type(HOOK_COMPLETED, 2)
    assert (fails["data"]["outcome"], fails["data"]["exit_code"]) == ("failed", 3)
    assert fails["data"]["error"] == "exited with status 3"
    assert fails["data"]["output_tail"] == "no disk\n"
    assert (missing["data"]["outcome"], missing["data"]["exit_code"]) == ("failed", None)
    assert "cannot start" in missing["data"]["error"]


async def test_timeout_kills_the_whole_process_group(gce_sim: Simulator, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pids)!r}, 'w').write(str(child.pid))\n"
        "print('working', flush=True)\n"
        "time.sleep(60)\n"
    )
    hooks = [python_hook("slow", code, timeout=1.0)]
    async with running_bridge(gce_sim, tmp_path, settings={"hooks": hooks}) as run:
        gce_sim.gce.set("instance/maintenance-event", MIGRATE)
        began = time.monotonic()
        (completed,) = await run.sink.wait_for_type(HOOK_COMPLETED, timeout=20)
        took = time.monotonic() - began
    data = completed["data"]
    assert (data["outcome"], data["timed_out"], data["exit_code"]) == ("timed-out", True, None)
    assert data["output_tail"] == "working\n"
    assert 1.0 <= data["duration_seconds"] < 5.0
    assert took < 8.0
    assert not alive(int(pids.read_text()))


async def test_deadline_before_not_before_shortens_the_timeout(
    azure_sim: Simulator, tmp_path: Path
) -> None:
    hooks = [
        python_hook("late", "import time; time.sleep(60)", timeout=600, deadline_before=3),
        python_hook("too-late", "print('never')", deadline_before=600),
    ]
    async with running_bridge(azure_sim, tmp_path, AZURE, settings={"hooks": hooks}) as run:
        azure_sim.azure.add_event(event_type="Reboot", not_before_in=5)
        late, too_late = await run.sink.wait_for_type(HOOK_COMPLETED, 2, timeout=20)
    assert late["data"]["outcome"] == "timed-out"
    assert late["data"]["duration_seconds"] < 3.5  # about 2 s: NotBefore - 3 s - now
    assert too_late["data"]["outcome"] == "skipped"
    assert "deadline" in too_late["data"]["error"]


async def test_hooks_run_in_order_for_one_event_and_concurrently_across_events(
    azure_sim: Simulator, tmp_path: Path
) -> None:
    out = tmp_path / "record.jsonl"
    slow = "import time; time.sleep(1)\n" + RECORD
    hooks = [python_hook("first", slow, str(out)), python_hook("second", RECORD, str(out))]
    async with running_bridge(azure_sim, tmp_path, AZURE, settings={"hooks": hooks}) as run:
        began = time.monotonic()
        one = azure_sim.azure.add_event(event_type="Reboot")
        two = azure_sim.azure.add_event(event_type="Redeploy")
        await run.sink.wait_for_type(HOOK_COMPLETED, 4, timeout=20)
        took = time.monotonic() - began
    order = [(r["event"]["data"]["notice_id"], r["env"]["MB_HOOK"]) for r in records(out)]
    for notice in (one, two):
        assert [hook for n, hook in order if n == notice] == ["first", "second"]
    assert took < 3.0  # two 1 s hooks on two notices: concurrent, not 2 s + 2 s


async def test_stop_during_a_hook_reports_it_interrupted_and_a_restart_does_not_rerun_it(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    out = tmp_path / "record.jsonl"
    hooks = [
        python_hook("drain", RECORD + "import time; time.sleep(60)", str(out), statuses=["started"])
    ]
    settings = {"hooks": hooks}
    async with running_bridge(gce_sim, tmp_path, settings=settings) as run:
        gce_sim.gce.set("instance/maintenance-event", MIGRATE)
        await eventually(lambda: records(out))
    # leaving the block stopped the bridge; the hook ran into the shutdown deadline
    (interrupted,) = run.sink.of_type(HOOK_COMPLETED)
    assert interrupted["data"]["outcome"] == "interrupted"
    async with running_bridge(gce_sim, tmp_path, sink=CheckedSink("m"), settings=settings) as run:
        assert await run.settle(1.0) == []
        gce_sim.gce.set("instance/maintenance-event", "NONE")
        await run.wait_for(1)
    assert len(records(out)) == 1
