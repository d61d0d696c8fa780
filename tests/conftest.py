from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bridge.simulator import Simulator


@pytest.fixture
async def gce_sim() -> AsyncIterator[Simulator]:
    async with Simulator(provider="gce") as sim:
        yield sim


@pytest.fixture
async def aws_sim() -> AsyncIterator[Simulator]:
    """AWS IMDS with IMDSv2 required (HttpTokens=required), as hardened fleets run it."""
    async with Simulator(provider="aws") as sim:
        sim.aws.quirks.v2_required = True
        yield sim


@pytest.fixture
async def azure_sim() -> AsyncIterator[Simulator]:
    async with Simulator(provider="azure") as sim:
        sim.faults.set(provider="azure", rate_limit=False)
        yield sim
