"""Fixtures for the simulator tests: an in-process simulator and a plain HTTP client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from bridge.simulator import Simulator

GOOGLE = {"Metadata-Flavor": "Google"}
AZURE = {"Metadata": "true"}
API = {"api-version": "2020-07-01"}


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    """Both providers, real speed; Azure's 5 req/s limit off (its own tests switch it on)."""
    async with Simulator(provider="both") as s:
        s.faults.set("azure", rate_limit=False)
        yield s


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as c:
        yield c
