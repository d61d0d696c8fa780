"""The fleet page at any size: one page of the notices in force with a link to the next,
counts from the store rather than from every row, a search that finds instances, and a
status filter. Read the way a browser without JavaScript reads it (real service, real
SQLite store, events posted through `POST /v1/events`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from html import unescape

import httpx
import pytest

from bridge.fleet.web import views
from bridge.pipeline.model import Status
from tests.fleet.conftest import FleetFactory
from tests.fleet.factories import gce_vm, heartbeat, transition
from tests.fleet.test_dashboard import Tables, page, post
from tests.fleet.world import FLEET, minutes

#: More notices in force than one page of the page holds.
MANY = views.PAGE_ROWS + 20


@pytest.fixture
async def crowded(fleet_service: FleetFactory) -> AsyncIterator[httpx.AsyncClient]:
    async with fleet_service() as service, httpx.AsyncClient(base_url=service.url) as http:
        await post(http, *FLEET)
        vms = [gce_vm(f"batch-{i:03d}", zone="us-east1-b") for i in range(MANY)]
        await post(http, *(heartbeat(vm, minutes(-1)) for vm in vms))
        await post(
            http,
            *(
                transition(vm, f"b-{i:03d}", Status.SCHEDULED, minutes(-5), not_before=minutes(i))
                for i, vm in enumerate(vms)
            ),
        )
        yield http


def page_rows(text: str) -> list[str]:
    """The instances of the "Now" table's rows."""
    return [row[5] for row in Tables(text).body("now")]


def _next(text: str, key: str) -> str:
    marker = f'id="{key}-next" href="'
    start = text.index(marker) + len(marker)
    return unescape(text[start : text.index('"', start)])


async def test_the_notices_in_force_come_a_page_at_a_time(crowded: httpx.AsyncClient) -> None:
    first_text = (await crowded.get("/")).text
    first = page_rows(first_text)
    assert len(first) == views.PAGE_ROWS
    # The caption and the headline count every notice in force, not the page.
    total = MANY + 4
    assert f"Notices in force, soonest first ({total})" in first_text
    assert '<dd id="scheduled">' + str(total - 1) + "</dd>" in first_text
    second_text = (await crowded.get(_next(first_text, "cursor"))).text
    second = page_rows(second_text)
    assert 'id="cursor-next"' not in second_text  # the last page
    assert len(first) + len(second) == total
    assert not set(first) & set(second)


async def test_a_search_finds_instances_and_filters_keep_their_pages(
    crowded: httpx.AsyncClient,
) -> None:
    found = await page(crowded, "/?q=batch-01")
    names = [row[0] for row in found.body("found")]
    assert names == [f"batch-01{i}" for i in range(10)]
    assert [row[3] for row in found.body("found")] == ["reporting"] * 10
    assert len(found.body("now")) == 10  # the notices of those instances
    # The next page's link keeps the filters.
    text = (await crowded.get("/?zone=us-east1-b")).text
    assert "zone=us-east1-b" in _next(text, "cursor")
    nobody = await page(crowded, "/?q=nobody-here")
    assert "found-empty" in nobody.ids


async def test_the_status_filter_and_the_fleet_tables(crowded: httpx.AsyncClient) -> None:
    started = await page(crowded, "/?status=started")
    assert [row[5] for row in started.body("now")] == ["web-1"]
    assert "coming-24h-empty" in started.ids  # nothing scheduled in a view of started ones
    zones = {row[0]: row[1:] for row in started.body("by-zone")}
    assert zones["us-east1-b"] == [str(MANY), "0", str(MANY)]
    providers = {row[0]: row[1:] for row in started.body("by-provider")}
    assert providers["gce"][2] == str(MANY + 3)
    assert (await crowded.get("/?status=done")).status_code == 400
