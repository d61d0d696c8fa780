"""The fleet page at 100,000 instances, in miniature: a timeline too crowded to draw one
shape per notice is drawn as counts per zone and hour, a zone or a search narrows back to
the notices, instances are listed by state a page at a time, and the instances retention
retired are shown as retired, apart from the silent ones, in the headline, the zone table
and the versions. Real service, real SQLite store, events posted through `POST /v1/events`,
pages read as a browser without JavaScript reads them.

The crowd is made small by lowering `views.DENSE` (the number of notices above which the
timeline counts) for the test: the service runs in this process, and 2,000 notices would
pin the same behaviour more slowly."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from bridge.fleet.service import build_store
from bridge.fleet.store import EventPage, EventQuery
from bridge.fleet.web import routes, views
from tests.fleet import world
from tests.fleet.conftest import FleetFactory
from tests.fleet.factories import batch, heartbeat
from tests.fleet.test_dashboard import page, post
from tests.fleet.world import FLEET
from tests.support import eventually

#: `retire_after_days` that retires the world's `quiet-1` (heard from an hour ago) only.
RETIRE_AFTER_30_MIN = 30 / (24 * 60)


@pytest.fixture
async def crowded(
    fleet_service: FleetFactory, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[httpx.AsyncClient]:
    """The world's fleet (five notices on the timeline) with the timeline counting above 3."""
    monkeypatch.setattr(views, "DENSE", 3)
    async with fleet_service() as service, httpx.AsyncClient(base_url=service.url) as http:
        await post(http, *FLEET)
        yield http


def cells(text: str) -> list[str]:
    """The tooltips of the counted timeline's cells."""
    drawing = text[text.index('<svg id="timeline-svg"') : text.index("</svg>")]
    return re.findall(r"<title>([^<]*)</title>", drawing)


async def test_a_crowded_timeline_counts_per_zone_and_hour(crowded: httpx.AsyncClient) -> None:
    text = (await crowded.get("/")).text
    assert 'id="timeline-counted"' in text
    drawn = cells(text)
    # Counts, not notices: no instance's name in any tooltip.
    assert not [tip for tip in drawn if "db-2" in tip or "web-1" in tip]
    assert "1 reboot completed: windows from" in " ".join(drawn)  # ev-0
    assert any(tip.startswith("1 completed from") for tip in drawn)
    assert any(tip.startswith("1 started from") for tip in drawn)  # g-1
    rows = re.findall(r'<a class="row" href="/\?zone=([^"]+)"', text)
    assert rows == ["europe-west1-b", "us-central1-a", "westeurope-1"]
    # The provider, kind and status filters pick among the counts.
    terminate = cells((await crowded.get("/?kind=terminate")).text)
    assert terminate
    assert all("terminate" in tip for tip in terminate)
    started = (await crowded.get("/?status=started")).text
    assert re.findall(r'<a class="row" href="/\?zone=([^"&]+)&amp;status=started"', started) == [
        "us-central1-a"
    ]


async def test_a_zone_or_a_search_narrows_the_crowd_back_to_its_notices(
    crowded: httpx.AsyncClient,
) -> None:
    # A zone's rows are its instances, each notice drawn, however crowded the fleet.
    zone = (await crowded.get("/?zone=westeurope-1")).text
    assert 'id="timeline-counted"' not in zone
    assert "db-2: reboot completed (ev-0)" in zone
    assert '<a class="row" href="/instances/db-1"' in zone
    # A search finding few notices draws them; one finding a crowd counts it.
    few = (await crowded.get("/?q=web-2")).text
    assert 'id="timeline-counted"' not in few
    assert "web-2: terminate scheduled (g-2)" in few
    crowd = (await crowded.get("/?q=-")).text  # every instance's name has one
    assert 'id="timeline-counted"' in crowd


async def test_instances_are_listed_by_state_a_page_at_a_time(
    fleet_service: FleetFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(views, "PAGE_ROWS", 2)
    async with fleet_service() as service, httpx.AsyncClient(base_url=service.url) as http:
        await post(http, *FLEET)
        reporting = await page(http, "/?state=reporting")
        first = [row[0] for row in reporting.body("found")]
        assert first == ["db-1", "db-2"]
        text = (await http.get("/?state=reporting")).text
        assert '<option value="reporting" selected>' in text
        following = re.search(r'id="icursor-next" href="([^"]+)"', text)
        assert following is not None
        assert "state=reporting" in following.group(1)
        more = await page(http, following.group(1).replace("&amp;", "&"))
        assert [row[0] for row in more.body("found")] == ["web-1", "web-2"]
        silent = await page(http, "/?state=silent")
        assert [(row[0], row[3]) for row in silent.body("found")] == [("quiet-1", "silent")]
        answer = await http.get("/?state=gone")
        assert answer.status_code == 400
        assert answer.json() == {
            "error": "state: expected one of reporting, silent, retired, got 'gone'"
        }


async def test_retired_instances_are_not_counted_as_silent(fleet_service: FleetFactory) -> None:
    async with (
        fleet_service(retention={"retire_after_days": RETIRE_AFTER_30_MIN}) as service,
        httpx.AsyncClient(base_url=service.url) as http,
    ):
        await post(http, *FLEET)
        assert service.pruner is not None
        await service.pruner.run_pass()  # retires quiet-1 (unless its own first pass did)
        found = await page(http, "/")
        text = (await http.get("/")).text
        assert '<dd id="reporting">4</dd>' in text
        assert '<dd id="silent">0</dd>' in text
        assert '<dd id="retired"><a href="/?state=retired">1</a></dd>' in text
        assert found.tables["by-zone"][0] == ["Zone", "Reporting", "Silent", "Retired", "Total"]
        zones = {row[0]: row[1:] for row in found.body("by-zone")}
        assert zones["us-central1-a"] == ["1", "0", "1", "2"]  # web-1, and quiet-1 retired
        providers = {row[0]: row[1:] for row in found.body("by-provider")}
        assert providers["gce"] == ["2", "0", "1", "3"]
        (version,) = found.body("versions")  # one build: this one's
        assert version[1:] == ["4", "0", "1", "5"]
        listed = await page(http, "/?state=retired")
        assert [(row[0], row[3]) for row in listed.body("found")] == [("quiet-1", "retired")]
        # Heard from again: reporting, and no longer retired anywhere on the page.
        await post(http, heartbeat(world.QUIET, world.minutes(0), sequence=9))
        again = (await http.get("/")).text
        assert '<dd id="reporting">5</dd>' in again
        assert 'id="retired"' not in again


async def test_the_page_does_not_wait_for_the_first_timeline(
    fleet_service: FleetFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading a week of a large audit log takes seconds: the page renders without the
    timeline meanwhile, and draws it once it is read."""
    gate = asyncio.Event()
    read = routes.DashboardRoutes._build

    async def slow(self: routes.DashboardRoutes, now: float, reach: float) -> views.Timeline:
        await gate.wait()
        return await read(self, now, reach)

    monkeypatch.setattr(routes.DashboardRoutes, "_build", slow)
    monkeypatch.setattr(routes, "FIRST_WAIT", 0.01)
    async with fleet_service() as service, httpx.AsyncClient(base_url=service.url) as http:
        await post(http, *FLEET)
        pending = await page(http, "/")
        assert "timeline-pending" in pending.ids
        assert [row[5] for row in pending.body("now")] == ["web-1", "db-1", "db-2", "web-2"]
        gate.set()

        async def drawn() -> bool:
            return "timeline-pending" not in (await http.get("/")).text

        await eventually(drawn)  # what the live update fetches once the store changes
        assert "db-2: reboot completed (ev-0)" in (await http.get("/")).text


async def test_a_timeline_read_afresh_gives_way_to_the_page_being_rendered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rebuild reads and decodes a slice at a time on the loop, and waits while a page
    is being rendered (a worker thread decoding beside the loop took the interpreter from
    the renders: the tail of the page at 10,000 VMs); it goes on once the page is out, and
    a slice at a time even while pages follow one another."""
    monkeypatch.setattr(routes, "BUILD_SLICE", 2)
    monkeypatch.setattr(routes, "IDLE_WAIT", 60.0)
    store = build_store(f"sqlite://{tmp_path / 'fleet.sqlite3'}")
    await store.open()
    try:
        await store.ingest(batch(*FLEET))
        dashboard = routes.DashboardRoutes(store, horizon=3600.0)
        building = asyncio.create_task(dashboard._build(time.time(), 7 * views.DAY))
        reads = 0
        read = store.events

        async def counted(query: EventQuery) -> EventPage:
            nonlocal reads
            reads += 1
            return await read(query)

        monkeypatch.setattr(store, "events", counted)
        with dashboard._render():  # a page under way
            for _ in range(50):
                await asyncio.sleep(0)
            assert (reads, building.done()) == (0, False)
        timeline = await building
        assert reads >= 1
        assert any("ev-0" in key for key in timeline.bars)
        assert timeline.counting
        assert sum(timeline.cells.values()) > 0
        # Pages rendered back to back do not starve it: a slice every IDLE_WAIT at least.
        monkeypatch.setattr(routes, "IDLE_WAIT", 0.001)
        with dashboard._render():
            again = await dashboard._build(time.time(), 7 * views.DAY)
        assert again.bars.keys() == timeline.bars.keys()
    finally:
        await store.close()
