"""Fixtures: a simulator of all three clouds, and the fleet's trust material taken from it
(`GET /_sim/identity/trust`) and written to files as an operator would."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridge.fleet.identity.trust import TrustFiles
from bridge.fleet.identity.verify import Policy
from bridge.infra.tls import Pem
from bridge.simulator import Simulator

from .documents import AUDIENCE


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    async with Simulator(provider="all") as s:
        s.faults.set("azure", rate_limit=False)
        yield s


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as c:
        yield c


def write_trust(material: dict[str, Any], folder: Path) -> TrustFiles:
    """The simulator's trust material as the files a fleet is configured with."""
    (folder / "jwks.json").write_text(json.dumps(material["jwks"]))
    (folder / "azure-ca.pem").write_text(material["ca_pem"])
    (folder / "aws.pem").write_text(material["certificate_pem"])
    return TrustFiles(
        gce_jwks=Pem.parse(str(folder / "jwks.json")),
        azure_jwks=Pem.parse(str(folder / "jwks.json")),
        azure_ca=Pem.parse(str(folder / "azure-ca.pem")),
        aws_certificate=Pem.parse(str(folder / "aws.pem")),
    )


@pytest.fixture
async def trust(sim: Simulator, client: httpx.AsyncClient, tmp_path: Path) -> TrustFiles:
    answer = await client.get(f"{sim.base_url}/_sim/identity/trust")
    answer.raise_for_status()
    return write_trust(answer.json(), tmp_path)


@pytest.fixture
async def policy(sim: Simulator, client: httpx.AsyncClient) -> Policy:
    answer = await client.get(f"{sim.base_url}/_sim/identity/trust")
    return Policy(audience=AUDIENCE, azure_signer_name=answer.json()["signer_name"])
