"""Clear errors from the command line, run as real processes: one line, the right exit code,
naming the file or the variable at fault; never a traceback."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

from bridge.pipeline.spool import DB_NAME
from bridge.simulator import Simulator
from tests.test_cli import bridge, write_config


def test_validate_config_takes_config_like_every_command(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bridge.toml", "[delivery]\nretry_max = 5\n")
    for args in (("--config", str(config)), ("-c", str(config)), (str(config),)):
        result = bridge("validate-config", *args)
        assert result.returncode == 0, result.stderr
        assert f"{config}: valid" in result.stdout


def test_a_configuration_that_is_not_utf8_is_exit_2_naming_the_file(tmp_path: Path) -> None:
    config = tmp_path / "latin1.toml"
    config.write_bytes('[listener]\nhost = "caf\u00e9"\n'.encode("latin-1"))
    for command in ("validate-config", "run"):
        result = bridge(command, "--config", str(config))
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        assert str(config) in result.stderr
        assert "not UTF-8" in result.stderr


def test_an_invalid_environment_override_names_the_variable(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bridge.toml", "[delivery]\nretry_max = 5\n")
    variable = "MAINTENANCE_BRIDGE__DELIVERY__RETRY_MAX"
    result = bridge("validate-config", "--config", str(config), env={variable: "soon"})
    assert result.returncode == 2
    assert variable in result.stderr
    assert "invalid environment" in result.stderr  # not the file, which is fine


def test_spool_commands_need_no_sink_secrets(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "bridge.toml",
        f"""
[state]
dir = "{tmp_path}"
[[sinks]]
type = "webhook"
name = "hook"
url = "https://hooks.example.com/maintenance"
bearer_token = "env:WEBHOOK_SECRET_NOT_SET_HERE"
""",
    )
    sqlite3.connect(tmp_path / DB_NAME).close()  # an (empty) spool exists
    assert "WEBHOOK_SECRET_NOT_SET_HERE" not in os.environ
    for action in ("list", "replay", "purge"):
        result = bridge("spool", action, "--config", str(config))
        assert result.returncode == 0, result.stderr
    # The commands that deliver still insist on the secret.
    assert bridge("validate-config", "--config", str(config)).returncode == 2


async def test_run_refuses_a_damaged_spool_with_one_line_and_exit_2(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / DB_NAME).write_bytes(b"this is not a database" * 500)
    async with Simulator(provider="gce") as sim:
        config = write_config(
            tmp_path / "bridge.toml",
            f"""
[source]
provider = "gce"
[source.gce]
metadata_url = "{sim.gce_url}"
[state]
dir = "{state}"
[listener]
port = 0
""",
        )
        result = await asyncio.to_thread(bridge, "run", "--config", str(config))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = [entry for entry in result.stderr.splitlines() if not entry.startswith("{")]
    assert line.startswith(f"maintenance-bridge: cannot use the spool {state / DB_NAME}")
    assert "move it aside" in line
