from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bridge import platform
from bridge.simulator import Simulator


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On Windows, skip the tests marked `posix` (the rest of the suite runs there too)."""
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
async def azure_sim() -> AsyncIterator[Simulator]:
    async with Simulator(provider="azure") as sim:
        sim.faults.set(provider="azure", rate_limit=False)
        yield sim
