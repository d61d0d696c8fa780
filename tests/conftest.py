from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bridge.infra import platform
from bridge.simulator import Simulator

#: Fixtures that start a POSIX-only program (the Pub/Sub emulator's launcher is a shell script).
POSIX_FIXTURES = frozenset({"pubsub_emulator", "pubsub_topic"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that use a POSIX-only fixture `posix`; on Windows, skip every test
    marked `posix` (the rest of the suite runs there too)."""
    for item in items:
        if POSIX_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.posix)
    if platform.current().name == "posix":
        return
    skip = pytest.mark.skip(reason="needs POSIX (signals by name, process groups, shell hooks)")
    for item in items:
        if "posix" in item.keywords:
            item.add_marker(skip)


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
