"""The instance search (`q`, a part of a name) on SQLite: an FTS5 trigram index kept in step
with `instances` by triggers (schema step 11), read for parts of three characters or more
when few names hold them; shorter parts, and a SQLite without FTS5's trigrams, walk the
names as before. Every answer is the one the walk gives. (PostgreSQL's trigram index and
its plan: tests/fleet/test_postgres_store.py.)"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bridge.fleet import migrations
from bridge.fleet.reads import FEW_NAMED, Reads
from bridge.fleet.service import build_store
from bridge.fleet.store import InstanceQuery
from tests.fleet.capture import Capture
from tests.fleet.factories import T0, azure_vm, batch, gce_vm, heartbeat

NOW = T0.timestamp() + 60


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Any]:
    store = build_store(f"sqlite://{tmp_path / 'fleet.sqlite3'}")
    await store.open()
    yield store
    await store.close()


async def names(store: Any, part: str, limit: int = 100) -> list[str]:
    page = await store.instance_page(InstanceQuery(search=part, limit=limit, now=NOW))
    return [row["name"] for row in page.rows]


def walked(store: Any, part: str) -> list[str]:
    """What the walk of the names answers (the search as it was before the index)."""
    with sqlite3.connect(store.path) as db:
        escaped = "".join(f"!{c}" if c in "!%_" else c for c in part)
        rows = db.execute(
            "SELECT name FROM instances WHERE name LIKE ? ESCAPE '!' OR source = ? "
            "ORDER BY name, source LIMIT 100",
            (f"%{escaped}%", part),
        )
        return [name for (name,) in rows]


def plan(store: Any, part: str) -> str:
    """SQLite's plan of the page query a search of `part` runs."""
    with sqlite3.connect(store.path) as db:
        capture = Capture(db)
        Reads.instance_page(capture, InstanceQuery(search=part, limit=100, now=NOW))
        page = next(s for s in capture.statements if "ORDER BY name, source" in s[0])
        rows = db.execute("EXPLAIN QUERY PLAN " + page[0], page[1]).fetchall()
        return "\n".join(str(row[-1]) for row in rows)


async def test_parts_of_any_length_find_what_the_walk_of_the_names_finds(store: Any) -> None:
    vms = [gce_vm(f"web-{i:03d}") for i in range(30)]
    vms += [azure_vm("DB_1"), azure_vm('quo"te-1'), gce_vm("x")]
    await store.ingest(batch(*(heartbeat(vm, T0) for vm in vms), received=T0))
    for part in ("WEB-01", "b-0", "eb-029", "b_", "DB_", "x", "-1", "1", "%", 'o"t', "zzz"):
        assert await names(store, part) == walked(store, part), part
    assert await names(store, "WEB-01") == [f"web-{i:03d}" for i in range(10, 20)]
    assert await names(store, "x") == ["x"]  # one character: no trigram, still found
    assert await names(store, "b_") == ["DB_1"]  # `_` is a character, not a wildcard
    assert await names(store, vms[3].source) == ["web-003"]  # the exact source


async def test_a_part_few_names_hold_reads_the_trigram_index_and_sorts_only_them(
    store: Any,
) -> None:
    vms = [gce_vm(f"vm-{i:05d}") for i in range(3000)]
    for start in range(0, len(vms), 500):
        beats = [heartbeat(vm, T0) for vm in vms[start : start + 500]]
        await store.ingest(batch(*beats, received=T0))
    rare = plan(store, "m-0123")  # ten names
    assert "instances_search VIRTUAL TABLE" in rare, rare
    assert "SCAN instances" not in rare.replace("SCAN instances_search", ""), rare
    assert await names(store, "m-0123") == [f"vm-{i:05d}" for i in range(1230, 1240)]
    # Every name holds "vm-": the walk in order finds a page at once, nothing to sort.
    common = plan(store, "vm-")
    assert "instances_search" not in common, common
    assert "TEMP B-TREE" not in common, common
    assert len(await names(store, "vm-")) == 100
    assert FEW_NAMED < 3000
    short = plan(store, "m-")  # two characters: no trigram to look up
    assert "instances_search" not in short, short


async def test_the_index_follows_new_instances_and_a_changed_name(store: Any) -> None:
    web = gce_vm("web-1")
    await store.ingest(batch(heartbeat(web, T0), received=T0))
    assert await names(store, "eb-1") == ["web-1"]
    renamed = replace(web, name="frontend-1")  # the same source, named anew
    await store.ingest(batch(heartbeat(renamed, T0, sequence=2), received=T0))
    assert await names(store, "eb-1") == []
    assert await names(store, "ontend") == ["frontend-1"]
    await store.ingest(batch(heartbeat(renamed, T0, sequence=3), received=T0))
    with sqlite3.connect(store.path) as db:
        assert db.execute("SELECT rowid, name FROM instances_search").fetchall() == [
            (1, "frontend-1")
        ]


async def test_a_store_written_before_the_index_gets_it_filled_on_open(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'fleet.sqlite3'}"
    store: Any = build_store(url)
    await store.open()
    vms = [gce_vm(f"web-{i}") for i in range(5)]
    await store.ingest(batch(*(heartbeat(vm, T0) for vm in vms), received=T0))
    before = await store.instances()
    await store.close()
    with sqlite3.connect(tmp_path / "fleet.sqlite3") as db:  # as the release before left it
        for trigger in ("insert", "rename", "delete"):
            db.execute(f"DROP TRIGGER instances_search_{trigger}")
        db.execute("DROP TABLE instances_search")
        db.execute("DELETE FROM schema_version WHERE version >= 11")
    again: Any = build_store(url)
    await again.open()
    try:
        assert await again.instances() == before
        assert await names(again, "web-") == [f"web-{i}" for i in range(5)]
        with sqlite3.connect(tmp_path / "fleet.sqlite3") as db:
            (indexed,) = db.execute("SELECT COUNT(*) FROM instances_search").fetchone()
            (version,) = db.execute("SELECT MAX(version) FROM schema_version").fetchone()
        assert (indexed, version) == (5, migrations.LATEST)
    finally:
        await again.close()


async def test_without_fts5_trigrams_the_search_walks_the_names_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A SQLite older than 3.34 has no trigram tokenizer: what it answers to the CREATE is
    # what an unknown tokenizer answers here ("no such tokenizer").
    broken = migrations._SQLITE_SEARCH[0].replace("'trigram'", "'trigram_of_the_future'")
    monkeypatch.setattr(migrations, "_SQLITE_SEARCH", (broken, *migrations._SQLITE_SEARCH[1:]))
    store: Any = build_store(f"sqlite://{tmp_path / 'fleet.sqlite3'}")
    with caplog.at_level(logging.WARNING, logger="bridge.fleet.store"):
        await store.open()
    try:
        (warning,) = [r.getMessage() for r in caplog.records if "instance search" in r.message]
        assert "SQLite 3.34" in warning
        assert "scan the names" in warning
        await store.ingest(batch(heartbeat(gce_vm("web-1"), T0), received=T0))
        assert await names(store, "eb-1") == ["web-1"]
        assert "instances_search" not in plan(store, "eb-1")
    finally:
        await store.close()
