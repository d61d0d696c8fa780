"""`maintenance-bridge doctor`, run as a real process against the simulator and a real webhook
receiver (aiohttp on loopback): what it reports for a healthy setup and for each broken part.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

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


def _listener_config(tmp_path: Path, sim: Simulator, port: int) -> Path:
    path = config_file(tmp_path, gce_source(sim), "http://127.0.0.1:9/hook")
    path.write_text(path.read_text().replace("port = 0", f"port = {port}"))
    return path


async def test_the_listener_port_held_by_a_bridge_is_said_to_be_a_bridge(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    from bridge.config import Listener
    from bridge.surface.health import HealthMonitor
    from bridge.surface.routes import serving

    # The bridge's own listener (the one `run` serves), in this test process.
    async with serving(Listener(port=0), HealthMonitor()) as listener:
        assert listener is not None
        port = listener.address[1]
        _, output = await doctor(_listener_config(tmp_path, gce_sim, port))
    found = line(output, "listener")
    assert " ok " in found
    assert f"127.0.0.1:{port}: a bridge is already running here (HTTP 200" in found
    assert f"pid {os.getpid()} (" in found  # this test process: a user sees its own sockets


async def test_the_listener_port_held_by_another_program_names_that_program(
    gce_sim: Simulator, tmp_path: Path
) -> None:
    """Any web server answers 200 to /healthz; that does not make it a bridge."""

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="OK")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        code, output = await doctor(_listener_config(tmp_path, gce_sim, port))
    finally:
        await runner.cleanup()
    assert code == 1
    found = line(output, "listener")
    assert " FAIL " in found
    assert "already running" not in output
    assert f"127.0.0.1:{port} is taken by another program: pid {os.getpid()} (" in found
    assert "/healthz: HTTP 200" in found
    assert "fix: stop that program, or set listener.port to a free port" in output


async def test_warnings_logged_during_the_checks_come_after_the_table_not_inside_it(
    tmp_path: Path,
) -> None:
    # Nothing listens on port 9: the identity step retries and logs its warnings (JSON lines,
    # stderr being a pipe here, merged into the same output as a user's `2>&1` does).
    source = '[source]\nprovider = "gce"\n[source.gce]\nmetadata_url = "http://127.0.0.1:9/"\n'
    code, output = await doctor(config_file(tmp_path, source, "http://127.0.0.1:9/hook"))
    assert code == 1
    lines = output.splitlines()
    assert lines[0].startswith("CHECK ")  # nothing before the table
    assert not [row for row in lines if row.startswith('{"time"')]  # no JSON log line at all
    summary = next(i for i, row in enumerate(lines) if "check(s) failed" in row)
    logged = next(i for i, row in enumerate(lines) if row.startswith("logged while checking"))
    assert logged > summary
    assert any("WARNING bridge.metadata: metadata request failed" in row for row in lines)


#: The resolver, replaced inside the doctor's process (the only mock here): a real failed
#: lookup would send a query to this machine's DNS server, which the tests never reach.
#: Every name under .invalid (RFC 6761) fails as glibc reports an unknown name.
NO_DNS = """
import socket, sys
real = socket.getaddrinfo
def getaddrinfo(host, *args, **kwargs):
    if isinstance(host, str) and host.endswith(".invalid"):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return real(host, *args, **kwargs)
socket.getaddrinfo = getaddrinfo
from bridge.cli import main
sys.exit(main(sys.argv[1:]))
"""


async def test_a_name_that_does_not_resolve_gets_the_dns_fix(tmp_path: Path) -> None:
    source = '[source]\nprovider = "gce"\n[source.gce]\nmetadata_url = "http://metadata.invalid/"\n'
    config = config_file(tmp_path, source, "https://hooks.invalid/hook")
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-c", NO_DNS, "doctor", "--config", str(config), "--timeout", "2"),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output = (await asyncio.wait_for(process.communicate(), 60))[0].decode()
    assert process.returncode == 1, output
    assert "cannot resolve metadata.invalid (DNS)" in line(output, "metadata")
    assert (
        "fix: metadata.invalid does not resolve here (DNS): check this host's resolver "
        "(/etc/resolv.conf, systemd-resolved; in a container, its DNS settings), or set the "
        "metadata URL with its address (169.254.169.254)"
    ) in output
    assert "cannot resolve hooks.invalid (DNS)" in line(output, "sink webhook")
    assert "fix: the host name does not resolve here (DNS)" in output
    assert "a proxy, a firewall" not in output  # the generic hint is for unreachable hosts
