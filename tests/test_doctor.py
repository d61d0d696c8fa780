"""`maintenance-bridge doctor`, run as a real process against the simulator and a real webhook
receiver (aiohttp on loopback): what it reports for a healthy setup and for each broken part.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bridge.simulator import Simulator
from tests.sinks.webhook_receiver import Reply, WebhookReceiver
from tests.support import assert_valid

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    server = await WebhookReceiver().start()
    yield server
    await server.stop()


async def doctor(config: Path, *args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge",
        "doctor",
        "--config",
        str(config),
        "--timeout",
        "2",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, output.decode()


def config_file(tmp_path: Path, source: str, sink_url: str) -> Path:
    path = tmp_path / "bridge.toml"
    path.write_text(
        f"""
{source}
[state]
dir = "{tmp_path / "state"}"
[listener]
port = 0
[[sinks]]
type = "webhook"
url = "{sink_url}"
"""
    )
    return path


def line(output: str, check: str) -> str:
    (found,) = [row for row in output.splitlines() if row.startswith(check + " ")]
    return found


def gce_source(sim: Simulator) -> str:
    return f"""
[source]
provider = "auto"
[source.gce]
metadata_url = "{sim.gce_url}"
[source.azure]
imds_url = "http://127.0.0.1:9/metadata/"
"""


async def test_a_healthy_gce_setup_passes_every_check(
    gce_sim: Simulator, receiver: WebhookReceiver, tmp_path: Path
) -> None:
    code, output = await doctor(config_file(tmp_path, gce_source(gce_sim), receiver.url))
    assert code == 0, output
    assert "gce (detected)" in line(output, "cloud")
    assert "Metadata-Flavor: Google, no redirect, no proxy" in line(output, "metadata")
    assert "sim-vm-1" in line(output, "identity")
    assert " ok " in line(output, "notices")
    assert " ok " in line(output, "sink webhook")
    assert output.rstrip().endswith("all checks passed")


async def test_a_broken_sink_fails_with_its_reason_and_exit_1(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    code, output = await doctor(
        config_file(tmp_path, gce_source(gce_sim), "http://127.0.0.1:9/hook")
    )
    assert code == 1
    assert "FAIL" in line(output, "sink webhook")
    assert "cannot reach http://127.0.0.1:9/hook" in line(output, "sink webhook")
    assert " ok " in line(output, "metadata")  # the rest is still checked and fine
    assert "1 check(s) failed" in output


async def test_a_receiver_refusing_credentials_is_reported(
    gce_sim: Simulator, receiver: WebhookReceiver, tmp_path: Path
) -> None:
    receiver.options_status = 401
    code, output = await doctor(config_file(tmp_path, gce_source(gce_sim), receiver.url))
    assert code == 1
    assert "401" in line(output, "sink webhook")


async def test_an_answer_without_the_vendor_header_is_refused_and_explained(
    gce_sim: Simulator, receiver: WebhookReceiver, tmp_path: Path
) -> None:
    gce_sim.faults.set(provider="gce", missing_vendor_header=1000)
    source = f'[source]\nprovider = "gce"\n[source.gce]\nmetadata_url = "{gce_sim.gce_url}"\n'
    code, output = await doctor(config_file(tmp_path, source, receiver.url))
    assert code == 1
    assert "set in source.provider" in line(output, "cloud")
    metadata = line(output, "metadata")
    assert "FAIL" in metadata
    assert "refused a response without 'Metadata-Flavor: Google'" in metadata
    assert "missing-vendor-header" in line(output, "identity")


async def test_no_cloud_at_all_says_what_was_tried(
    receiver: WebhookReceiver, tmp_path: Path
) -> None:
    source = """
[source]
detect_timeout = 0.5
[source.gce]
metadata_url = "http://127.0.0.1:9/computeMetadata/v1/"
[source.azure]
imds_url = "http://127.0.0.1:9/metadata/"
[source.aws]
imds_url = "http://127.0.0.1:9/"
"""
    code, output = await doctor(config_file(tmp_path, source, receiver.url))
    assert code == 1
    assert "no metadata service found" in line(output, "cloud")
    assert "Azure IMDS at http://127.0.0.1:9/metadata/" in output
    assert "AWS IMDS at http://127.0.0.1:9/: token PUT" in output
    assert "fix: run on a GCE, Azure or AWS VM" in output


async def test_an_azure_event_in_force_is_a_warning(
    azure_sim: Simulator, receiver: WebhookReceiver, tmp_path: Path
) -> None:
    azure_sim.azure.add_event(event_type="Freeze", duration=5)
    source = f'[source]\nprovider = "azure"\n[source.azure]\nimds_url = "{azure_sim.azure_url}"\n'
    code, output = await doctor(config_file(tmp_path, source, receiver.url))
    assert code == 0, output
    assert "scheduledevents: HTTP 200" in line(output, "metadata")
    notices = line(output, "notices")
    assert "WARN" in notices
    assert "freeze scheduled" in notices
    assert "0 check(s) failed, 1 warning(s)" in output


async def test_send_test_event_delivers_a_valid_test_event_to_each_sink(
    gce_sim: Simulator, receiver: WebhookReceiver, tmp_path: Path
) -> None:
    code, output = await doctor(
        config_file(tmp_path, gce_source(gce_sim), receiver.url), "--send-test-event"
    )
    assert code == 0, output
    assert "accepted io.maintenancebridge.test id " in line(output, "sink webhook test event")
    (post,) = receiver.posts()
    event = assert_valid(json.loads(post.body))
    assert event["type"] == "io.maintenancebridge.test"
    assert event["source"].endswith("/instances/sim-vm-1")
    assert not (tmp_path / "state" / "spool.sqlite3").exists()  # sent directly, never spooled


async def test_a_test_event_the_receiver_refuses_is_a_failure(
    gce_sim: Simulator, receiver: WebhookReceiver, tmp_path: Path
) -> None:
    receiver.default = Reply(400)
    code, output = await doctor(
        config_file(tmp_path, gce_source(gce_sim), receiver.url), "--send-test-event"
    )
    assert code == 1
    assert "refused for good" in line(output, "sink webhook test event")


async def test_the_spool_is_found_and_checked_read_only(
    gce_sim: Simulator, receiver: WebhookReceiver, tmp_path: Path
) -> None:
    from bridge.pipeline.spool import Spool

    spool = Spool(tmp_path / "state", ["webhook"])
    await spool.open()
    await spool.close()
    config = config_file(tmp_path, gce_source(gce_sim), receiver.url)
    code, output = await doctor(config)
    assert code == 0, output
    assert "(no spool yet)" not in line(output, "state")
    assert "quick_check ok" in line(output, "spool")

    with spool.path.open("r+b") as file:  # damage every table page, keep the file header
        file.seek(4096)
        file.write(b"\xff" * (spool.path.stat().st_size - 4096))
    before = spool.path.read_bytes()
    code, output = await doctor(config)
    assert code == 1, output
    assert " FAIL " in line(output, "spool")
    assert "move it aside" in output
    assert spool.path.read_bytes() == before  # read-only: the doctor never repairs or writes
