"""Fleet replicas sharing an Event Hubs consumer group through the store they share
(`share_partitions`, bridge/fleet/sources/eventhubs_ownership.py): each reads its share of
the partitions, every event is stored once, and when one replica goes the other takes its
partitions over after their last committed batch.

Real parts only: the repo's AMQP Event Hubs test server (tests/sinks/eventhub_server.py),
the official consumer with its own load balancer, and a real PostgreSQL server
(tests/fleet/postgres_server.py: skipped without its binaries, failing under CI=true).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from bridge.fleet.config import parse_fleet_config
from bridge.fleet.service import FleetService
from bridge.fleet.sources.base import SourceHealth
from tests.fleet.test_eventhubs_source import last_sequences, send, stream
from tests.sinks.eventhub_server import EventHubServer
from tests.support import eventually

pytest_plugins = ["tests.fleet.postgres_server"]

#: Seconds between the consumers' looks at the ownership table (an owner that stopped
#: renewing loses its partitions after six of them).
INTERVAL = 0.3


@pytest.fixture
async def hub() -> AsyncIterator[EventHubServer]:
    async with EventHubServer(partitions=4) as server:
        yield server


def replica(url: str, hub: EventHubServer) -> FleetService:
    raw: dict[str, Any] = {
        "fleet": {
            "listener": {"port": 0},
            "store": {"url": url},
            "sources": [
                {
                    "type": "eventhubs",
                    "connection_string": hub.connection_string,
                    "consumer_group": "fleet",
                    "batch_size": 5,
                    "retry_initial": 0.05,
                    "retry_max": 0.2,
                    "share_partitions": True,
                    "load_balancing_interval": INTERVAL,
                }
            ],
        }
    }
    return FleetService(parse_fleet_config(raw))


def partitions_of(health: SourceHealth) -> set[str]:
    """The partitions a source reads, from its health ("partitions 0,2: N event(s)")."""
    if not health.ok:
        return set()
    listed = health.detail.removeprefix("partitions ").split(":", 1)[0]
    return set(listed.split(","))


async def total(service: FleetService) -> int:
    return int((await service.store.counts())["events"])


async def test_replicas_split_the_partitions_and_store_every_event_once(
    postgres_url: str, hub: EventHubServer
) -> None:
    rounds = [stream(n) for n in range(4)]
    first, second = replica(postgres_url, hub), replica(postgres_url, hub)
    reads = [first.sources[0], second.sources[0]]
    async with first.running():
        await send(hub, rounds[0])
        await eventually(lambda: len(partitions_of(reads[0].health())) == 4, timeout=30)
        async with second.running():

            def split() -> bool:
                mine, theirs = (partitions_of(r.health()) for r in reads)
                return bool(mine) and bool(theirs) and not mine & theirs

            await eventually(split, timeout=30)
            for bodies in rounds[1:3]:
                await send(hub, bodies)

            async def all_in() -> bool:
                return await total(first) == sum(len(r) for r in rounds[:3])

            await eventually(all_in, timeout=30)
        accepted = [s.stats.counts[("eventhubs", "accepted")] for s in (first, second)]
        assert sum(accepted) == sum(len(r) for r in rounds[:3])  # each event once
        assert accepted[1] > 0  # the replica that joined read its share

        # The second replica is gone: the first takes its partitions over, each right
        # after the last batch the second committed.
        await eventually(lambda: len(partitions_of(reads[0].health())) == 4, timeout=30)
        await send(hub, rounds[3])

        async def everything() -> bool:
            return await total(first) == sum(len(r) for r in rounds)

        await eventually(everything, timeout=30)
        assert first.stats.counts[("eventhubs", "accepted")] == accepted[0] + len(rounds[3])
        assert first.stats.counts.get(("eventhubs", "duplicate"), 0) == 0
        assert await first.store.checkpoints("eventhubs") == last_sequences(hub)
