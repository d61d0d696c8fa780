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
from tests.support import eventually
from tests.test_crash import Process

from .fleets import heartbeats, running, sidecar_toml

pytestmark = pytest.mark.slow


@pytest.fixture
async def fleet_url(sim: Simulator, tmp_path: Path) -> AsyncIterator[tuple[Simulator, str]]:
    async with running(sim, tmp_path) as fleet:
        yield sim, fleet.url


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
