"""One file may hold a sidecar's and a fleet's configuration (docs/fleet.md): it is valid for
`maintenance-bridge validate-config` and for `maintenance-bridge fleet validate-config`, and
each command still names the mistakes in its own tables."""

from __future__ import annotations

from pathlib import Path

from tests.test_cli import bridge

COMBINED = """
[source]
provider = "gce"
[[sinks]]
type = "webhook"
url = "http://127.0.0.1:8790/v1/events"
[fleet.listener]
port = 8790
[fleet.store]
url = "postgresql://fleet:secret-password@127.0.0.1:5432/fleet"
[[fleet.sources]]
type = "http"
"""


def test_a_combined_file_is_valid_for_the_sidecar_and_for_the_fleet(tmp_path: Path) -> None:
    path = tmp_path / "both.toml"
    path.write_text(COMBINED)
    sidecar = bridge("validate-config", str(path))
    assert sidecar.returncode == 0, sidecar.stderr
    assert "valid" in sidecar.stdout
    fleet = bridge("fleet", "validate-config", "--config", str(path))
    assert fleet.returncode == 0, fleet.stderr
    assert "valid fleet configuration" in fleet.stdout
    assert "http (http)" in fleet.stdout
    assert "secret-password" not in fleet.stdout + fleet.stderr


def test_each_command_names_the_mistakes_of_its_own_tables(tmp_path: Path) -> None:
    path = tmp_path / "both.toml"
    path.write_text(COMBINED.replace("port = 8790", 'port = "high"') + "\n[delivery]\nretry = 1\n")
    fleet = bridge("fleet", "validate-config", "--config", str(path))
    assert fleet.returncode == 2
    assert "fleet.listener.port" in fleet.stderr
    sidecar = bridge("validate-config", str(path))
    assert sidecar.returncode == 2
    assert "delivery.retry" in sidecar.stderr
    assert "fleet" not in sidecar.stderr
