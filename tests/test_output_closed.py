"""Every command ends quietly when the reader of its output went away (`... | head -1`).

Each command runs as a real process whose stdout is a pipe the test closed before the
process started: its first write meets a closed pipe, deterministically (no race with a
`head` that may or may not have exited yet). It must end without a traceback, with the
status a shell reports for a writer stopped by SIGPIPE (141).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge.fleet.sqlite_store import SqliteStore
from bridge.infra.stdout import EXIT_OUTPUT_CLOSED
from bridge.pipeline.model import Status
from tests.fleet.factories import T0, azure_vm, batch, heartbeat, transition
from tests.test_cli import ROOT, write_config

pytestmark = pytest.mark.posix  # a pipe without a reader is a POSIX notion of the test


def closed_output(*args: str, timeout: float = 60) -> tuple[int, str, float]:
    """(status, stderr, seconds) of `maintenance-bridge ARGS` writing into a closed pipe."""
    reader, writer = os.pipe()
    os.close(reader)  # nobody will ever read: every write fails with EPIPE
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "bridge", *args],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=timeout,
            cwd=ROOT,
        )
    finally:
        os.close(writer)
    return done.returncode, done.stderr, time.monotonic() - started


def assert_quiet(status: int, stderr: str, *, statuses: tuple[int, ...] = ()) -> None:
    assert "Traceback" not in stderr, stderr
    assert "BrokenPipeError" not in stderr, stderr
    assert "Exception ignored" not in stderr, stderr
    assert status in (EXIT_OUTPUT_CLOSED, *statuses), stderr


def test_schema() -> None:
    assert_quiet(*closed_output("schema")[:2])


@pytest.mark.parametrize("args", [(), ("spool",), ("fleet", "status")], ids=" ".join)
def test_help(args: tuple[str, ...]) -> None:
    # argparse itself ignores a failed write of the help text, so the status may stay 0.
    assert_quiet(*closed_output(*args, "--help")[:2], statuses=(0,))


def test_validate_config_and_spool_list(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "bridge.toml", f'[state]\ndir = "{tmp_path}"\n[[sinks]]\ntype = "stdout"\n'
    )
    assert_quiet(*closed_output("validate-config", str(config))[:2])
    (tmp_path / "spool.sqlite3").touch()  # `spool list` only reads an existing spool
    assert_quiet(*closed_output("spool", "list", "--config", str(config))[:2])


async def test_fleet_status_and_export(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "fleet.db")  # events in it: status and export have output
    await store.open()
    vm = azure_vm("db-1")
    await store.ingest(batch(heartbeat(vm, T0), transition(vm, "ev-1", Status.SCHEDULED, T0)))
    await store.close()
    config = str(
        write_config(
            tmp_path / "fleet.toml", f'[fleet.store]\nurl = "sqlite://{tmp_path}/fleet.db"\n'
        )
    )
    assert_quiet(*closed_output("fleet", "status", "--config", config)[:2])
    assert_quiet(*closed_output("fleet", "export", "--config", config)[:2])
    assert_quiet(*closed_output("fleet", "export", "--config", config, "--format", "csv")[:2])


def test_the_demo_stops_when_nobody_reads_it_any_more() -> None:
    """`demo | head -1`: the demo stops at its first unread event, not after the scenario."""
    status, stderr, seconds = closed_output("demo", timeout=60)  # a 60 s scenario at speed 1
    assert_quiet(status, stderr)
    assert seconds < 20, stderr
    assert "scenario over" not in stderr
