"""The command line, run as real processes (`python -m bridge ...`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bridge.cli import build_parser
from bridge.pipeline.events import schema
from bridge.simulator import Simulator, SimulatorThread
from tests.support import assert_valid, free_port

ROOT = Path(__file__).resolve().parent.parent


def bridge(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_version_and_help() -> None:
    assert bridge("--version").stdout.startswith("maintenance-bridge ")
    help_text = bridge("--help").stdout
    for command in ("run", "once", "demo", "schema", "validate-config", "simulate", "spool"):
        assert command in help_text


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _commands(sub, (*path, name))


def test_every_command_says_what_it_does_in_its_help() -> None:
    commands = dict(_commands(build_parser()))
    assert {("run",), ("once",), ("schema",), ("spool", "list"), ("fleet", "status")} <= set(
        commands
    )
    assert [" ".join(path) for path, sub in commands.items() if not sub.description] == []
    for path, start in (
        (("run",), "The sidecar: detect the cloud"),
        (("once",), "Detect the cloud, read its metadata service once"),
        (("schema",), "Print the JSON Schema"),
        (("spool",), "The spool is the bridge's outbox"),
        (("spool", "replay"), "Move dead letters back"),
        (("fleet", "status"), "Print the fleet summary as tables"),
    ):
        shown = bridge(*path, "--help")
        assert shown.returncode == 0, shown.stderr
        assert start in " ".join(shown.stdout.split()), path


def test_schema_prints_the_shipped_schema() -> None:
    result = bridge("schema")
    assert result.returncode == 0
    assert json.loads(result.stdout) == schema()
    assert json.loads((ROOT / "schemas" / "maintenance-event.v1.json").read_text()) == schema()


def test_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "bad.toml",
        """
[source]
provider = "oci"
[source.azure]
pol_interval = 1
[[sinks]]
type = "webhook"
""",
    )
    for command in ("validate-config", "run --config"):
        result = bridge(*command.split(), str(config))
        assert result.returncode == 2, result.stderr
        assert "source.provider" in result.stderr
        assert "source.azure.pol_interval: unknown key" in result.stderr
        assert "sinks[0].url: required" in result.stderr


def test_a_mistyped_key_or_sink_type_gets_a_did_you_mean(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "typo.toml",
        '[delivery]\nshutdown_timout = 3\n[[sinks]]\ntype = "webhok"\n',
    )
    result = bridge("validate-config", str(config))
    assert result.returncode == 2, result.stderr
    assert "delivery.shutdown_timout: unknown key; did you mean 'shutdown_timeout'?" in (
        result.stderr
    )
    assert "unknown sink type 'webhok'; did you mean 'webhook'?" in result.stderr
    assert "memory" not in result.stderr


def test_unreadable_or_invalid_toml_exits_2(tmp_path: Path) -> None:
    assert bridge("validate-config", str(tmp_path / "missing.toml")).returncode == 2
    broken = write_config(tmp_path / "broken.toml", "[source\n")
    result = bridge("validate-config", str(broken))
    assert result.returncode == 2
    assert "not valid TOML" in result.stderr


def test_config_from_environment(tmp_path: Path) -> None:
    config = write_config(tmp_path / "ok.toml", '[[sinks]]\ntype = "stdout"\n')
    result = bridge(
        "validate-config",
        env={
            "MAINTENANCE_BRIDGE_CONFIG": str(config),
            "MAINTENANCE_BRIDGE__SOURCE__AZURE__POLL_INTERVAL": "0.01",
        },
    )
    assert result.returncode == 2
    assert "source.azure.poll_interval" in result.stderr


def test_once_prints_the_notices_in_force(tmp_path: Path) -> None:
    with SimulatorThread(provider="gce") as sim:
        sim.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
        result = bridge(
            "once",
            env={"GCE_METADATA_HOST": sim.gce_host, "MAINTENANCE_BRIDGE__SOURCE__PROVIDER": "auto"},
        )
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    event = assert_valid(json.loads(line))
    assert event["type"] == "io.maintenancebridge.maintenance.started"


def test_once_without_any_metadata_service_says_so(tmp_path: Path) -> None:
    result = bridge(
        "once",
        env={
            "MAINTENANCE_BRIDGE__SOURCE__GCE__METADATA_URL": "http://127.0.0.1:9/computeMetadata/v1/",
            "MAINTENANCE_BRIDGE__SOURCE__AZURE__IMDS_URL": "http://127.0.0.1:9/metadata/",
            "MAINTENANCE_BRIDGE__SOURCE__DETECT_TIMEOUT": "0.5",
        },
    )
    assert result.returncode == 1
    assert "no metadata service found" in result.stderr


@pytest.mark.posix  # SIGTERM/SIGINT to a child process
async def test_run_delivers_to_a_file_serves_its_listener_and_exits_0_on_sigterm(
    tmp_path: Path,
) -> None:
    out = tmp_path / "events.jsonl"
    port = free_port()
    async with Simulator(provider="azure") as sim:
        sim.faults.set(provider="azure", rate_limit=False)
        config = write_config(
            tmp_path / "bridge.toml",
            f"""
[source]
provider = "auto"
[source.gce]
metadata_url = "http://127.0.0.1:9/computeMetadata/v1/"
[source.azure]
imds_url = "{sim.azure_url}"
poll_interval = 0.25
[state]
dir = "{tmp_path / "state"}"
[listener]
port = {port}
[heartbeat]
interval = 0
[[sinks]]
type = "file"
path = "{out}"
""",
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bridge",
            "--log-format",
            "json",
            "run",
            "--config",
            str(config),
            cwd=ROOT,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            sim.azure.add_event(event_type="Freeze", duration=5)
            deadline = time.monotonic() + 20
            while not (out.exists() and out.read_text().strip()):
                assert time.monotonic() < deadline, "no event delivered"
                await asyncio.sleep(0.1)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                healthz = await client.get("/healthz")
                metrics = await client.get("/metrics")
            process.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(process.wait(), 15)
        finally:
            if process.returncode is None:
                process.kill()
        assert process.stderr is not None
        logs = (await process.stderr.read()).decode()
    assert code == 0, logs
    (line,) = out.read_text().splitlines()
    assert assert_valid(json.loads(line))["data"]["kind"] == "freeze"
    log_lines = [json.loads(entry) for entry in logs.splitlines() if entry.startswith("{")]
    assert any(entry["message"].startswith("notice: azure freeze scheduled") for entry in log_lines)
    assert any(entry["message"].startswith("listening on http://127.0.0.1:") for entry in log_lines)
    assert healthz.status_code == 200
    assert 'maintenance_bridge_events_delivered_total{sink="file"} 1' in metrics.text


@pytest.mark.posix  # SIGTERM/SIGINT to a child process
async def test_sigterm_while_no_cloud_is_found_yet_exits_0(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "bridge.toml",
        f"""
[source]
provider = "auto"
detect_timeout = 0.2
[source.gce]
metadata_url = "http://127.0.0.1:9/computeMetadata/v1/"
[source.azure]
imds_url = "http://127.0.0.1:9/metadata/"
[state]
dir = "{tmp_path / "state"}"
[listener]
port = 0
""",
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge",
        "run",
        "--config",
        str(config),
        cwd=ROOT,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    line = await asyncio.wait_for(process.stderr.readline(), 20)
    while b"no metadata service found" not in line:
        line = await asyncio.wait_for(process.stderr.readline(), 20)
    process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(process.wait(), 10) == 0


def test_a_listener_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(
            tmp_path / "bridge.toml",
            f'[state]\ndir = "{tmp_path}"\n[listener]\nport = {port}\n',
        )
        result = bridge("run", "--config", str(config), timeout=30)
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "listener.enabled = false" in result.stderr


#: The demo scenario's user-initiated Azure Reboot (bridge/simulator/scenarios/demo.toml).
DEMO_USER_REBOOT = "5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7"


def test_demo_at_speed_10_reports_all_15_notices_and_the_user_reboot_completed() -> None:
    """Each transition of the scenario, once: the Azure polls keep up with the faster clock
    (a 5 s `Started` lasts 0.5 s at --speed 10), and the user's Reboot ran, not cancelled."""
    result = bridge("demo", "--speed", "10", timeout=120)
    assert result.returncode == 0, result.stderr
    events = [assert_valid(json.loads(line)) for line in result.stdout.splitlines()]
    providers = {e["data"]["provider"] for e in events}
    assert providers == {"gce", "azure", "aws"}
    assert len({e["id"] for e in events}) == len(events)  # nothing doubled
    notices = [e for e in events if e["type"].startswith("io.maintenancebridge.maintenance.")]
    assert len(notices) == 15, [(e["type"], e["data"]["notice_id"]) for e in notices]
    assert "scenario over: 15 notice(s) delivered" in result.stderr
    reboot = [e["data"]["status"] for e in notices if e["data"]["notice_id"] == DEMO_USER_REBOOT]
    assert reboot == ["scheduled", "started", "completed"]
    assert "while it plays: curl http://127.0.0.1:" in result.stderr  # the status API is served


@pytest.mark.parametrize("speed", ["0", "-1", "fast", "inf"])
def test_demo_refuses_a_speed_that_is_not_above_zero(speed: str) -> None:
    result = bridge("demo", "--speed", speed)
    assert result.returncode == 2
    assert "argument --speed:" in result.stderr
    assert "Traceback" not in result.stderr


async def test_spool_list_replay_purge(tmp_path: Path) -> None:
    from bridge.pipeline.dispatch import Dispatcher
    from bridge.pipeline.events import serialize
    from bridge.pipeline.spool import NewEvent, Spool
    from bridge.sinkapi import Reject
    from sinks.memory import MemorySink
    from tests.factories import sample_events

    config = write_config(
        tmp_path / "bridge.toml",
        f"""
[state]
dir = "{tmp_path}"
[[sinks]]
type = "stdout"
name = "hook"
""",
    )
    spool = Spool(tmp_path, ["hook"])
    await spool.open()
    events = sample_events(2)
    await spool.commit(
        [NewEvent(e.get_id(), e.get_source(), e.get_type(), serialize(e)) for e in events]
    )
    sink = MemorySink("hook")
    sink.max_batch = 1  # type: ignore[misc]
    sink.fail_next(Reject("HTTP 400 from receiver"))
    dispatcher = Dispatcher(spool, [sink])
    dispatcher.start()
    dispatcher.notify()
    await sink.wait_for(1)
    await dispatcher.stop(1.0)
    await spool.close()

    listed = bridge("spool", "list", "--config", str(config))
    assert listed.returncode == 0, listed.stderr
    assert "dead letters: 1" in listed.stdout
    assert events[0].get_id() in listed.stdout
    assert "HTTP 400 from receiver" in listed.stdout

    replayed = bridge("spool", "replay", "--config", str(config), "--sink", "hook")
    assert "replayed 1 event(s)" in replayed.stdout
    listed = bridge("spool", "list", "--config", str(config))
    assert "pending  hook: 1 event(s)" in listed.stdout
    assert "dead letters: 0" in listed.stdout
    assert "purged 0" in bridge("spool", "purge", "--config", str(config)).stdout
