"""Group commit: concurrent one-event posts share a transaction, each answered only after it
committed; a failed transaction fails every request in it with 503; a full ingest queue is
503 with Retry-After at once. On SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridge.fleet.config import parse_fleet_config
from bridge.fleet.group_commit import GroupCommit
from bridge.fleet.service import FleetService, build_store
from bridge.fleet.store import Batch, EventQuery, IngestResult, Store, StoreError
from bridge.pipeline.model import Status
from tests.fleet.factories import T0, batch, gce_vm, transition
from tests.support import eventually

pytest_plugins = ["tests.fleet.postgres_server"]

STRUCTURED = {"content-type": "application/cloudevents+json"}


class Gated:
    """Wraps a real store: each group transaction waits for `gate` (a slow disk, which a real
    store cannot be made into on demand), and fails while `failing` is set (an outage).
    Everything else is the real store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.gate = asyncio.Event()
        self.gate.set()
        self.failing = False
        self.groups: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def ingest_many(self, batches: Sequence[Batch]) -> list[IngestResult]:
        self.groups.append(len(batches))
        await self.gate.wait()
        if self.failing:
            raise StoreError("simulated outage of the fleet store")
        return await self.store.ingest_many(batches)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'fleet.sqlite3'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def serve(store_url: str) -> Callable[..., Any]:
    @asynccontextmanager
    async def start(**ingest: Any) -> AsyncIterator[tuple[FleetService, Gated]]:
        raw = {
            "fleet": {
                "listener": {"port": 0},
                "store": {"url": store_url},
                "ingest": ingest,
                "sources": [{"type": "http"}],
            }
        }
        gated = Gated(build_store(store_url))
        service = FleetService(parse_fleet_config(raw), store=gated)
        async with service.running():
            yield service, gated

    return start


def posts(count: int, prefix: str = "ev") -> list[bytes]:
    return [
        transition(gce_vm(f"vm-{i}"), f"{prefix}-{i}", Status.SCHEDULED, T0, not_before=T0)
        for i in range(count)
    ]


async def test_concurrent_posts_share_transactions_and_are_answered_after_the_commit(
    serve: Callable[..., Any],
) -> None:
    async with serve(group_wait=0.05) as (service, gated), httpx.AsyncClient() as http:
        gated.gate.clear()  # the first group waits: the others queue behind it

        async def post(index: int, body: bytes) -> int:
            answer = await http.post(f"{service.url}/v1/events", content=body, headers=STRUCTURED)
            # Answered only after the commit: another connection reads the event already.
            page = await service.store.events(EventQuery(instance=f"vm-{index}"))
            assert [row[3] for row in page.rows] == [body]
            return answer.status_code

        sent = [asyncio.create_task(post(i, body)) for i, body in enumerate(posts(40))]
        await eventually(lambda: gated.groups)
        assert not any(task.done() for task in sent)  # nobody answered before a commit
        gated.gate.set()
        assert await asyncio.gather(*sent) == [200] * 40
        assert (await service.store.counts())["events"] == 40
        assert sum(gated.groups) == 40
        assert len(gated.groups) < 40  # shared transactions
        assert max(gated.groups) > 1
        # The groups' size under load, for an operator: posts over transactions.
        metrics = (await http.get(f"{service.url}/metrics")).text
        assert f"fleet_ingest_group_transactions_total {len(gated.groups)}" in metrics
        assert "fleet_ingest_group_batches_total 40" in metrics


async def test_a_failed_group_transaction_fails_every_request_in_it_with_503(
    serve: Callable[..., Any],
) -> None:
    async with serve(group_wait=0.05) as (service, gated), httpx.AsyncClient() as http:
        gated.failing = True
        answers = await asyncio.gather(
            *(
                http.post(f"{service.url}/v1/events", content=body, headers=STRUCTURED)
                for body in posts(20)
            )
        )
        assert [a.status_code for a in answers] == [503] * 20
        assert all(a.headers["Retry-After"] for a in answers)
        assert len(gated.groups) < 20  # they failed together, not one by one
        assert (await service.store.counts())["events"] == 0
        gated.failing = False  # the senders retry: everything arrives, once
        again = await asyncio.gather(
            *(
                http.post(f"{service.url}/v1/events", content=body, headers=STRUCTURED)
                for body in posts(20)
            )
        )
        assert [a.status_code for a in again] == [200] * 20
        assert (await service.store.counts())["events"] == 20


async def test_a_full_ingest_queue_is_503_with_retry_after_and_never_grows(
    serve: Callable[..., Any],
) -> None:
    async with serve(max_queued=5, group_wait=0) as (service, gated), httpx.AsyncClient() as http:
        gated.gate.clear()
        url = f"{service.url}/v1/events"
        held = [
            asyncio.create_task(http.post(url, content=body, headers=STRUCTURED))
            for body in posts(5)
        ]
        await eventually(lambda: service.group.queued == 5)
        refused = await http.post(url, content=posts(1, "late")[0], headers=STRUCTURED)
        assert refused.status_code == 503
        assert refused.headers["Retry-After"] == "1"
        assert "retry" in refused.json()["error"]
        assert service.group.queued == 5
        metrics = (await http.get(f"{service.url}/metrics")).text
        assert 'fleet_ingest_overloaded_total{source="http"} 1' in metrics
        gated.gate.set()
        assert [a.status_code for a in await asyncio.gather(*held)] == [200] * 5
        later = await http.post(url, content=posts(1, "late")[0], headers=STRUCTURED)
        assert later.status_code == 200
        assert (await service.store.counts())["events"] == 6


async def test_posts_past_max_requests_are_503_with_retry_after_before_they_are_read(
    serve: Callable[..., Any],
) -> None:
    """At most `max_requests` posts are handled at once, whatever the queue holds: in a burst
    the others are answered 503 at once (their bodies not parsed, not queued) and retry."""
    async with serve(max_requests=3, group_wait=0) as (service, gated), httpx.AsyncClient() as http:
        gated.gate.clear()
        url = f"{service.url}/v1/events"
        held = [
            asyncio.create_task(http.post(url, content=body, headers=STRUCTURED))
            for body in posts(3)
        ]
        await eventually(lambda: service.group.handling == 3)
        refused = await http.post(url, content=posts(1, "late")[0], headers=STRUCTURED)
        assert refused.status_code == 503
        assert refused.headers["Retry-After"] == "1"
        assert "3 ingest requests are being handled (at most 3); retry" in refused.json()["error"]
        assert service.group.queued == 3  # the refused post was not queued
        metrics = (await http.get(f"{service.url}/metrics")).text
        assert 'fleet_ingest_overloaded_total{source="http"} 1' in metrics
        gated.gate.set()
        assert [a.status_code for a in await asyncio.gather(*held)] == [200] * 3
        assert service.group.handling == 0
        retried = await http.post(url, content=posts(1, "late")[0], headers=STRUCTURED)
        assert retried.status_code == 200
        assert (await service.store.counts())["events"] == 4


async def test_a_batch_larger_than_a_group_is_committed_alone(
    serve: Callable[..., Any],
) -> None:
    async with serve(group_events=10) as (service, gated), httpx.AsyncClient() as http:
        body = b"[" + b",".join(posts(25)) + b"]"
        answer = await http.post(
            f"{service.url}/v1/events",
            content=body,
            headers={"content-type": "application/cloudevents-batch+json"},
        )
        assert answer.status_code == 200
        assert answer.json()["accepted"] == 25
        assert gated.groups == [1]


class Picky(Gated):
    """Refuses (ValueError, as a store refuses an event it cannot hold) any transaction
    holding the notice `poison`; the real store commits the rest."""

    poison = "ev-3"

    async def ingest_many(self, batches: Sequence[Batch]) -> list[IngestResult]:
        self.groups.append(len(batches))
        notices = [getattr(a.event.data, "notice_id", None) for b in batches for a in b.accepted]
        if self.poison in notices:
            raise ValueError("an event this store cannot hold")
        return await self.store.ingest_many(batches)


async def test_a_group_failing_for_one_batch_commits_the_others_one_by_one(
    store_url: str,
) -> None:
    store = Picky(build_store(store_url))
    await store.open()
    try:
        group = GroupCommit(store, max_wait=0.05)
        outcomes = await asyncio.gather(
            *(group.commit(batch(body)) for body in posts(6)), return_exceptions=True
        )
        await group.close()
        refused = [o for o in outcomes if isinstance(o, Exception)]
        assert len(refused) == 1
        assert isinstance(refused[0], ValueError)  # its own error, not the store's outage
        assert sum(1 for o in outcomes if isinstance(o, IngestResult) and o.accepted == 1) == 5
        assert (await store.counts())["events"] == 5
        assert store.groups[0] == 6  # one group first, then one by one
    finally:
        await store.close()
