"""Real `maintenance-bridge run` sidecars on each simulated cloud enroll with a real
`maintenance-bridge fleet` that requires identity, and their events (heartbeats) are
accepted: the whole chain of the signed document, `POST /v1/enroll`, the credential on every
webhook post and the binding, with nothing refused. A GCE VM without a service account
cannot enroll, and its events wait in the spool instead of being sent unattested."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from bridge.simulator import Simulator
from tests.fleet.test_end_to_end import FleetProcess
from tests.support import eventually, free_port
from tests.test_crash import Process

from .conftest import AUDIENCE
from .test_fleet_binding import fleet_toml

pytestmark = pytest.mark.slow
SOURCE = {
    "gce": lambda sim: f'metadata_url = "{sim.gce_url}"',
    "azure": lambda sim: f'imds_url = "{sim.azure_url}"\npoll_interval = 0.25',
    "aws": lambda sim: f'imds_url = "{sim.aws_url}"\npoll_interval = 0.25',
}


def sidecar_toml(folder: Path, sim: Simulator, cloud: str, fleet: str, sink: str = "") -> Path:
    """A sidecar enrolling with `fleet` and sending to its http source, or to the sink of
    the `[[sinks]]` table `sink` (e.g. a bus's)."""
    webhook = f'[[sinks]]\ntype = "webhook"\nname = "fleet"\nurl = "{fleet}/v1/events"\n'
    folder.mkdir()
    config = folder / "bridge.toml"
    config.write_text(f"""
[source]
provider = "{cloud}"
[source.{cloud}]
{SOURCE[cloud](sim)}
[state]
dir = "{folder / "state"}"
[listener]
enabled = false
[heartbeat]
interval = 1
[delivery]
retry_initial = 0.05
retry_max = 0.5
[identity]
enroll_url = "{fleet}/v1/enroll"
audience = "{AUDIENCE}"
{sink or webhook}""")
    return config


@pytest.fixture
async def fleet_url(tmp_path: Path) -> AsyncIterator[tuple[Simulator, str]]:
    async with Simulator(provider="all") as sim:
        sim.faults.set("azure", rate_limit=False)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(timeout=10) as plain:
            material = (await plain.get(f"{sim.base_url}/_sim/identity/trust")).json()
        fleet = FleetProcess(fleet_toml(tmp_path, port, material), url)
        await fleet.start()
        try:
            yield sim, url
        finally:
            await fleet.stop()


async def heartbeats(url: str) -> list[str]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        events = (await http.get("/v1/fleet/events?limit=500")).json()
    return [e["source"] for e in events if e["type"].endswith(".heartbeat")]


@pytest.mark.parametrize("cloud", ["gce", "azure", "aws"])
async def test_a_sidecar_enrolls_and_its_events_are_accepted(
    fleet_url: tuple[Simulator, str], tmp_path: Path, cloud: str
) -> None:
    sim, url = fleet_url
    sidecar = Process(sidecar_toml(tmp_path / cloud, sim, cloud, url))
    await sidecar.start()
    try:

        async def delivered() -> bool:
            return len(await heartbeats(url)) >= 2

        await eventually(delivered, timeout=30)
    finally:
        await sidecar.stop()
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        assert (await http.get("/v1/fleet/rejected")).json()["count"] == 0


async def test_a_gce_vm_without_service_account_sends_nothing_unattested(
    fleet_url: tuple[Simulator, str], tmp_path: Path
) -> None:
    sim, url = fleet_url
    sim.identity = sim.identity.replace("gce", type(sim.identity.gce)(service_account=""))
    sidecar = Process(sidecar_toml(tmp_path / "gce", sim, "gce", url))
    await sidecar.start()
    try:

        async def asked() -> bool:
            return any("service-accounts" in r.path for r in sim.requests)

        await eventually(asked, timeout=30)
    finally:
        await sidecar.stop()
    assert await heartbeats(url) == []
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        assert (await http.get("/v1/fleet/rejected")).json()["count"] == 0
