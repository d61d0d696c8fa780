"""The benchmarks' pre-fill (`bench.fleet_prefill`: ingest's own writer, the audit log
appended in bulk) leaves a store that reads exactly as one filled through `ingest`: the same
events in the same order, the same instances, notices, kept counts and silent tallies, on
SQLite and on a real PostgreSQL server (tests/fleet/postgres_server.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.fleet_prefill import prefill
from bench.fleet_workload import Workload
from bridge import contract
from bridge.fleet import tallies
from bridge.fleet.service import build_store
from bridge.fleet.store import Accepted, Batch, EventQuery, NoticeFilter

pytest_plugins = ["tests.fleet.postgres_server"]

#: 200 VMs, every part of the workload: notices in force, finished ones, heartbeat rounds.
WORKLOAD = Workload(200, 1_500)


@pytest.fixture(params=["sqlite", "postgresql"])
def new_url(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], str]:
    if request.param == "sqlite":
        names = iter(range(10))
        return lambda: f"sqlite://{tmp_path / f'fleet-{next(names)}.sqlite3'}"
    server = request.getfixturevalue("postgres_server")
    return server.create_database  # type: ignore[no-any-return]


async def ingested(url: str, bodies: list[bytes]) -> None:
    """The way a fleet service fills it: batches of 100 through `Store.ingest`."""
    store = build_store(url)
    await store.open()
    try:
        for start in range(0, len(bodies), 100):
            chunk = bodies[start : start + 100]
            accepted = [Accepted(contract.from_cloudevent(body), body) for body in chunk]
            await store.ingest(Batch(ingest="http", received_at=time.time(), accepted=accepted))
    finally:
        await store.close()


async def contents(url: str, now: float) -> dict[str, Any]:
    """Everything the API reads, without the receive times (which differ by construction)."""
    store = build_store(url)
    await store.open()
    try:
        page = await store.events(EventQuery(limit=10_000))
        return {
            "events": [(seq, ingest, body) for seq, ingest, _received, body in page.rows],
            "counts": await store.counts(),
            "instances": await store.instances(),
            "notices": await store.notices(NoticeFilter(), in_force=False),
            "in force": await store.notices(NoticeFilter()),
            "notice counts": sorted(await store.notice_counts(), key=repr),
            "instance counts": sorted(await store.instance_counts(now)),
            "tallies": sorted(await store.transaction(tallies.read)),
        }
    finally:
        await store.close()


async def test_a_prefilled_store_reads_the_same_as_an_ingested_one(
    new_url: Callable[[], str],
) -> None:
    bodies = list(WORKLOAD.history())
    assert len(bodies) == WORKLOAD.events
    by_ingest, by_prefill = new_url(), new_url()
    await ingested(by_ingest, bodies)
    await prefill([by_prefill], bodies)

    now = time.time()
    expected, found = await contents(by_ingest, now), await contents(by_prefill, now)
    assert found["counts"]["events"] == WORKLOAD.events  # every event once
    assert len(found["events"]) == WORKLOAD.events
    assert len(found["instances"]) == 200
    assert found["in force"]
    assert found["tallies"]
    for part in expected:
        assert found[part] == expected[part], part


async def test_the_prefill_refuses_an_event_already_stored(new_url: Callable[[], str]) -> None:
    bodies = list(WORKLOAD.history())[:50]
    url = new_url()
    await prefill([url], bodies)
    with pytest.raises(Exception, match=r"already held|duplicate key|event_keys_pkey"):
        await prefill([url], bodies[:1])
    store = build_store(url)
    await store.open()
    try:
        assert (await store.counts())["events"] == 50
    finally:
        await store.close()
