"""Each store keeps, per instance, whether its latest events came with a verified instance
credential (#34, `identity = "optional"` while a fleet migrates): attested, unattested, or
unchecked (its source checks no identity). The API, the page and the metrics read it from
here, so every replica on one PostgreSQL shows the same.

Every test runs against SQLite and a real PostgreSQL server, as tests/fleet/test_store.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from bridge.fleet.store import InstanceQuery, Store
from tests.fleet.factories import T0, azure_vm, batch, gce_vm, heartbeat
from tests.fleet.test_store import at, make_store, store

__all__ = ["make_store", "store"]  # the fixtures, imported to be found

pytest_plugins = ["tests.fleet.postgres_server"]

WEB = gce_vm("web-1")
DB = azure_vm("db-1")
OLD = gce_vm("old-1")


async def attestation(store: Store) -> dict[str, str]:
    return {row["name"]: row["attestation"] for row in await store.instances()}


async def test_the_latest_batch_of_an_instance_says_whether_it_was_attested(
    store: Store,
) -> None:
    await store.ingest(replace(batch(heartbeat(WEB, at(0))), attested=True))
    await store.ingest(replace(batch(heartbeat(DB, at(0))), attested=False))
    await store.ingest(batch(heartbeat(OLD, at(0))))  # a source that checks no identity
    assert await attestation(store) == {
        "web-1": "attested",
        "db-1": "unattested",
        "old-1": "unchecked",
    }
    assert await store.attestation_counts() == {"attested": 1, "unattested": 1, "unchecked": 1}

    # db-1's sidecar enrolled: its next events carry its credential.
    await store.ingest(replace(batch(heartbeat(DB, at(1), sequence=1)), attested=True))
    # A replay without one changes nothing: a duplicate is not a new event.
    await store.ingest(replace(batch(heartbeat(WEB, at(0))), attested=False))
    assert (await attestation(store))["db-1"] == "attested"
    assert (await attestation(store))["web-1"] == "attested"
    assert await store.attestation_counts() == {"attested": 2, "unattested": 0, "unchecked": 1}


async def test_the_instance_list_filters_by_attestation(store: Store) -> None:
    await store.ingest(replace(batch(heartbeat(WEB, at(0))), attested=True))
    await store.ingest(replace(batch(heartbeat(DB, at(0))), attested=False))
    await store.ingest(batch(heartbeat(OLD, at(0))))
    now = T0.timestamp() + 3600
    for wanted, names in (
        ("attested", ["web-1"]),
        ("unattested", ["db-1"]),
        ("unchecked", ["old-1"]),
        (None, ["db-1", "old-1", "web-1"]),
    ):
        page = await store.instance_page(InstanceQuery(attestation=wanted, now=now))
        assert [row["name"] for row in page.rows] == names, wanted


async def test_a_store_created_before_the_column_gets_it_when_opened(
    make_store: Callable[[], Store],
) -> None:
    first = make_store()
    await first.open()
    await first.ingest(batch(heartbeat(WEB, at(0))))

    def as_before(db: object) -> None:  # a store of the schema before the column's step
        execute = db.execute  # type: ignore[attr-defined]
        execute("DROP INDEX instances_attested")
        execute("ALTER TABLE instances DROP COLUMN attested")
        execute("DELETE FROM schema_version WHERE version >= 7")

    await first.transaction(as_before)
    await first.close()

    again = make_store()
    await again.open()
    try:
        assert await attestation(again) == {"web-1": "unchecked"}
        await again.ingest(replace(batch(heartbeat(DB, at(0))), attested=True))
        assert await attestation(again) == {"db-1": "attested", "web-1": "unchecked"}
    finally:
        await again.close()
