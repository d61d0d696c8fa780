"""A running fleet service (real aiohttp listener, real SQLite store) for the fleet tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from bridge.fleet.config import parse_fleet_config
from bridge.fleet.service import FleetService
from tests.fleet import world

#: Standard Webhooks secrets: the current one and the one being rotated out.
SECRET = "whsec_" + "c2VjcmV0LWtleS1mb3ItZmxlZXQtdGVzdHMtMDAwMQ=="
OLD_SECRET = "whsec_" + "b2xkLXNlY3JldC1rZXktZm9yLWZsZWV0LXRlc3RzMDE="

FleetFactory = Callable[..., AbstractAsyncContextManager[FleetService]]


@pytest.fixture(autouse=True)
def _fleet_clock() -> None:
    """The shared fleet (`tests/fleet/world.py`) is built around the time the test starts."""
    world.refresh()


@pytest.fixture
def fleet_service(tmp_path: Path) -> FleetFactory:
    """`async with fleet_service(sources=[...], api={...}) as service:` serves on a free port."""

    @asynccontextmanager
    async def start(
        sources: list[dict[str, Any]] | None = None, **tables: Any
    ) -> AsyncIterator[FleetService]:
        raw = {
            "fleet": {
                "listener": {"port": 0},
                "store": {"url": f"sqlite://{tmp_path / 'fleet.sqlite3'}"},
                "sources": sources if sources is not None else [{"type": "http"}],
                **tables,
            }
        }
        service = FleetService(parse_fleet_config(raw))
        async with service.running():
            yield service

    return start
