"""What the identity tests share: a real `maintenance-bridge fleet` trusting the simulator's
keys (`running`), a sidecar's configuration enrolling with it (`sidecar_toml`), and the
simulated VM as its sidecar names it in its events (`vm_of`). A helper module, so test
modules import it rather than each other."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import httpx

from bridge.pipeline.model import Instance, Provider
from bridge.simulator import Simulator
from tests.fleet.test_end_to_end import FleetProcess
from tests.support import free_port

from .documents import AUDIENCE, source_of

#: The fleet's `credential_key` (at least 32 bytes).
KEY: Final = "k" * 40
NOW: Final = datetime.now(UTC)
SOURCE: Final = {
    "gce": lambda sim: f'metadata_url = "{sim.gce_url}"',
    "azure": lambda sim: f'imds_url = "{sim.azure_url}"\npoll_interval = 0.25',
    "aws": lambda sim: f'imds_url = "{sim.aws_url}"\npoll_interval = 0.25',
}


async def trust_material(sim: Simulator) -> dict[str, Any]:
    """The simulator's keys and certificates (`GET /_sim/identity/trust`)."""
    async with httpx.AsyncClient(timeout=10) as plain:
        answer = await plain.get(f"{sim.base_url}/_sim/identity/trust")
    answer.raise_for_status()
    material: dict[str, Any] = answer.json()
    return material


def fleet_toml(
    folder: Path, port: int, material: dict[str, Any], mode: str = "required", source: str = ""
) -> Path:
    """A fleet requiring (or not, `mode`) identity on its one http source, or with the
    `[[fleet.sources]]` table `source` instead (e.g. a bus's)."""
    http = f'[[fleet.sources]]\ntype = "http"\nidentity = "{mode}"\n'
    (folder / "jwks.json").write_text(json.dumps(material["jwks"]))
    (folder / "ca.pem").write_text(material["ca_pem"])
    (folder / "aws.pem").write_text(material["certificate_pem"])
    config = folder / "fleet.toml"
    config.write_text(f"""
[fleet.listener]
port = {port}
[fleet.store]
url = "sqlite://{folder}/fleet.db"
[fleet.identity]
audience = "{AUDIENCE}"
credential_key = "{KEY}"
gce_jwks = "{folder}/jwks.json"
azure_jwks = "{folder}/jwks.json"
azure_ca = "{folder}/ca.pem"
azure_signer_name = "{material["signer_name"]}"
aws_certificate = "{folder}/aws.pem"
{source or http}""")
    return config


async def start(
    sim: Simulator, folder: Path, mode: str = "required", source: str = ""
) -> FleetProcess:
    """A `maintenance-bridge fleet` process trusting `sim` (`fleet_toml`), ready."""
    port = free_port()
    config = fleet_toml(folder, port, await trust_material(sim), mode, source)
    process = FleetProcess(config, f"http://127.0.0.1:{port}")
    await process.start()
    return process


@asynccontextmanager
async def running(
    sim: Simulator, folder: Path, mode: str = "required", source: str = ""
) -> AsyncIterator[FleetProcess]:
    """`start`, and stopped on the way out."""
    process = await start(sim, folder, mode, source)
    try:
        yield process
    finally:
        await process.stop()


def vm_of(sim: Simulator, cloud: str) -> Instance:
    """The simulated VM as its sidecar names it in its events."""
    source = source_of(sim, cloud)
    if cloud == "gce":
        g = sim.identity.gce
        return Instance(
            provider=Provider.GCE,
            id=str(g.instance_id),
            name=g.instance_name,
            source=source,
            resource_id=source.removeprefix("//compute.googleapis.com/"),
            zone=g.zone,
            project=g.project_id,
        )
    if cloud == "azure":
        a = sim.identity.azure
        return Instance(
            provider=Provider.AZURE,
            id=a.vm_id,
            name=a.name,
            source=source,
            resource_id=source,
            subscription=a.subscription_id,
            resource_group=a.resource_group_name,
        )
    w = sim.identity.aws
    return Instance(
        provider=Provider.AWS,
        id=w.instance_id,
        name=w.instance_id,
        source=source,
        resource_id=source,
        account=w.account_id,
    )


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


async def heartbeats(url: str) -> list[str]:
    """The sources of the heartbeats the fleet at `url` stored."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        events = (await http.get("/v1/fleet/events?limit=500")).json()
    return [e["source"] for e in events if e["type"].endswith(".heartbeat")]
