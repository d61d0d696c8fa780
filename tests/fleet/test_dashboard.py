"""The fleet dashboard's HTML over HTTP, read the way a browser without JavaScript reads it.

The same small fleet as tests/fleet/test_api.py, posted through `POST /v1/events`; the
page's tables are parsed with the standard library's HTML parser.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import timedelta
from html.parser import HTMLParser
from importlib.resources import files
from typing import Any

import httpx
import pytest

from bridge.fleet.web import render, views
from bridge.pipeline.model import Kind, Status
from tests.fleet import world
from tests.fleet.conftest import FleetFactory
from tests.fleet.factories import approval, gce_vm, heartbeat, hook_run, transition
from tests.fleet.world import DB1, FLEET, minutes

BATCH = {"content-type": "application/cloudevents-batch+json"}


class Tables(HTMLParser):
    """Rows (lists of cell texts) of every `<table id=...>`, headers included."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.ids: set[str] = set()
        self._table: str | None = None
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(str(found["id"]))
        if tag == "table":
            self._table = str(found.get("id"))
            self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._table and self._cell is not None:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def body(self, table: str) -> list[list[str]]:
        return self.tables[table][1:]


async def post(http: httpx.AsyncClient, *bodies: bytes) -> None:
    answer = await http.post("/v1/events", content=b"[" + b",".join(bodies) + b"]", headers=BATCH)
    assert answer.status_code == 200, answer.text


@pytest.fixture
async def web(fleet_service: FleetFactory) -> AsyncIterator[httpx.AsyncClient]:
    async with fleet_service() as service, httpx.AsyncClient(base_url=service.url) as http:
        await post(http, *FLEET)
        yield http


async def page(http: httpx.AsyncClient, path: str) -> Tables:
    answer = await http.get(path)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/html")
    return Tables(answer.text)


async def test_the_page_reads_without_javascript(web: httpx.AsyncClient) -> None:
    found = await page(web, "/")
    # Started first, then by start time; a scheduled notice of unknown time last.
    assert [row[5] for row in found.body("now")] == ["web-1", "db-1", "db-2", "web-2"]
    assert found.tables["now"][0] == [
        "Starts",
        "Status",
        "Kind",
        "Provider",
        "Zone",
        "Instance",
        "Origin",
        "Sidecar did",
    ]
    assert [row[5] for row in found.body("coming-24h")] == ["db-1", "db-2"]
    assert "coming-7d-empty" in found.ids
    where = {row[0]: row[1:] for row in found.body("where")}
    assert where["europe-west1-b"] == ["", "", "1", "1"]  # live-migrate, reboot, terminate
    # Azure's zone 1 is filed under its region: zone 1 of another region is another row
    assert where["westeurope-1"] == ["", "2", "", "2"]
    for figure, expected in (("reporting", "4"), ("silent", "1"), ("started", "1")):
        assert f'<dd id="{figure}">{expected}</dd>' in (await web.get("/")).text


async def test_filters_come_from_the_url(web: httpx.AsyncClient) -> None:
    by_provider = await page(web, "/?provider=azure")
    assert [row[5] for row in by_provider.body("now")] == ["db-1", "db-2"]
    by_text = await page(web, "/?q=WEB&kind=terminate")
    assert [row[5] for row in by_text.body("now")] == ["web-2"]
    # What the form sends without JavaScript: the empty fields too, which mean "any".
    plain = await page(web, "/?provider=&zone=&kind=&q=web-2")
    assert [row[5] for row in plain.body("now")] == ["web-2"]
    azure = (await web.get("/?provider=azure")).text  # the headline counts the view
    assert '<dd id="reporting">2</dd>' in azure
    assert '<dd id="silent">0</dd>' in azure
    empty = await page(web, "/?zone=nowhere")
    assert "now-empty" in empty.ids
    # The form shows the filters it was given, so a link opens the same view.
    text = (await web.get("/?provider=azure&q=db")).text
    assert '<option value="azure" selected>' in text
    assert 'name="q" type="search" value="db"' in text


async def test_the_timeline_drills_down_from_zones_to_instances(web: httpx.AsyncClient) -> None:
    zones = (await web.get("/")).text
    assert (
        '<a class="row" href="/?zone=westeurope-1" title="westeurope-1">westeurope-1</a>' in zones
    )
    assert "db-2: reboot completed (ev-0)" in zones  # finished within the last 7 days
    one_zone = (await web.get("/?zone=westeurope-1")).text
    assert '<a class="row" href="/instances/db-1"' in one_zone
    assert '<a class="row" href="/instances/db-2"' in one_zone
    assert 'href="/instances/web-1" title' not in one_zone


def test_the_timeline_zooms_from_a_month_to_a_day() -> None:
    """A burst within an hour is one line at a week's zoom and three windows at a day's."""
    now = world.NOW.timestamp()
    burst = [
        views.Bar("vm", f"n-{i}", f"//vm/{i}", "gce", "z", "reboot", "scheduled",
                  now + 3600 + i * 1200, now + 3600 + i * 1200 + 300, [], [])
        for i in range(3)
    ]  # fmt: skip

    def starts(drawn: str) -> list[int]:
        return [int(x) for x in re.findall(r'<rect class="win[^"]*" x="(\d+)"', drawn)]

    week = render.timeline_svg(burst, now, views.Filters())
    assert max(starts(week)) - min(starts(week)) <= 2  # one line
    day = render.timeline_svg(burst, now, views.Filters(zoom=views.zoom_of("day")))
    first, second, third = starts(day)
    assert second - first >= 4  # three windows apart
    assert third - second >= 4
    assert ">+24h</text>" in day
    assert ">+7d</text>" in week
    month = render.timeline_svg(burst, now, views.Filters(zoom=views.zoom_of("month")))
    assert ">+30d</text>" in month
    assert ">-30d</text>" in month


async def test_the_zoom_lives_in_the_url_and_a_bad_one_is_400(web: httpx.AsyncClient) -> None:
    week = (await web.get("/")).text
    assert "Timeline: last 7 days and next 7 days, per zone" in week
    assert '<strong aria-current="true">week</strong>' in week
    assert '<a href="/?zoom=day" data-zoom="day">day</a>' in week
    day = (await web.get("/?zoom=day&provider=azure")).text
    assert "Timeline: last 24 hours and next 24 hours" in day
    # Every link of the view keeps the zoom: the other zooms, the drill-downs, the form.
    assert '<a href="/?provider=azure&amp;zoom=month" data-zoom="month">' in day
    assert '<a class="row" href="/?provider=azure&amp;zone=westeurope-1&amp;zoom=day"' in day
    assert '<input type="hidden" name="zoom" value="day">' in day
    month = (await web.get("/?zoom=month")).text
    assert "db-2: reboot completed (ev-0)" in month  # a month reaches as far as a week
    for bad in ("year", "DAY", "1"):
        answer = await web.get(f"/?zoom={bad}")
        assert answer.status_code == 400
        assert answer.json() == {"error": f"zoom: expected one of week, day, month, got {bad!r}"}


async def test_the_timeline_follows_the_audit_log_between_renders(web: httpx.AsyncClient) -> None:
    assert "web-3" not in (await web.get("/")).text  # the timeline is built and kept
    vm = gce_vm("web-3", zone="asia-east1-a")
    await post(
        web,
        transition(vm, "g-9", Status.SCHEDULED, minutes(-20), not_before=minutes(-10)),
        transition(vm, "g-9", Status.STARTED, minutes(-10)),
        transition(vm, "g-9", Status.COMPLETED, minutes(-5)),
    )
    text = (await web.get("/?zone=asia-east1-a")).text  # finished: only the log tells
    assert "web-3: reboot completed (g-9)" in text
    assert 'class="mark-started"' in text
    assert 'class="mark-completed"' in text


async def test_the_instance_page_shows_history_heartbeat_and_eligibility(
    web: httpx.AsyncClient,
) -> None:
    scheduled = transition(DB1, "ev-1", Status.SCHEDULED, minutes(-5), not_before=minutes(10))
    await post(web, approval(scheduled, minutes(-4)), hook_run(scheduled, minutes(-3)))
    found = await page(web, "/instances/db-1")
    assert [row[2:5] for row in found.body("history")] == [
        [
            "maintenance.scheduled",
            "ev-1",
            f"reboot scheduled, not before {minutes(10):%Y-%m-%d %H:%M} UTC",
        ],
        ["maintenance.approved", "ev-1", "approved by vm (preset)"],
        ["hook.completed", "ev-1", "hook drain: succeeded (exit 0)"],
    ]
    assert found.body("now")[0][7] == "approved (preset); drain: succeeded"
    text = (await web.get("/instances/db-1")).text
    # One heartbeat age on the page (the ticking one), the state without one of its own.
    assert '<dd id="sidecar-state">reporting</dd>' in text
    assert text.count("data-countdown") - text.count('id="now"') >= 1
    assert re.search(r'<dd id="heartbeat"><time datetime="[^"]+" data-countdown', text)
    assert len(re.findall(r"\d+s ago|\dm \d\ds ago", text.split('id="h-inforce"')[0])) == 1
    assert '<td data-label="Detail" class="detail">' in text  # wraps (dashboard.css)
    assert '<dd id="eligibility">not eligible: ' in text
    assert "1 heartbeats not listed" in text
    for bad in ("nan", "-1", "0", "x", "1000"):
        answer = await web.get(f"/instances/db-1?days={bad}")
        assert answer.status_code == 400
        assert answer.json()["error"].startswith("days: ")
    assert (await web.get("/instances/db-1?days=30")).status_code == 200
    unknown = await web.get("/instances/nobody")
    assert unknown.status_code == 404
    assert "No event of this instance reached the fleet service." in unknown.text


async def test_the_version_moves_with_the_store(web: httpx.AsyncClient) -> None:
    first = (await web.get("/dashboard/version")).json()["version"]
    await post(web, heartbeat(gce_vm("new-1"), world.NOW))
    second = (await web.get("/dashboard/version")).json()["version"]
    assert first != second
    assert f'data-version="{second}"' in (await web.get("/")).text


async def test_assets_ship_in_the_package(web: httpx.AsyncClient) -> None:
    css = await web.get("/static/dashboard.css")
    assert css.headers["content-type"].startswith("text/css")
    assert "prefers-color-scheme: dark" in css.text
    script = await web.get("/static/dashboard.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert (await web.get("/static/../api.py")).status_code == 404
    assert (await web.get("/static/nothing.js")).status_code == 404
    text = (await web.get("/")).text
    assert "http://" not in text.split("<main")[0]  # no CDN: every asset is our own


def test_store_text_is_escaped() -> None:
    notice: dict[str, Any] = {
        "notice_id": "<b>n</b>",
        "instance": "<script>alert(1)</script>",
        "provider": "gce",
        "zone": '"z"',
        "kind": "reboot",
        "status": "scheduled",
        "not_before": None,
        "window": None,
        "event": {"data": {"origin": "<i>"}},
        "transitions": [],
    }
    text = render.notices_table("t", "caption", [notice], world.NOW.timestamp())
    assert "<script>" not in text
    assert "<b>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "/instances/%3Cscript%3Ealert%281%29%3C%2Fscript%3E" in text


def test_a_notice_under_way_counts_from_when_it_started() -> None:
    started = (world.NOW - timedelta(minutes=2)).isoformat()
    estimate = (world.NOW + timedelta(minutes=1)).isoformat()  # GCE's estimated not_before
    notice = {
        "status": "started",
        "not_before": estimate,
        "transitions": [{"status": "started", "time": started}],
    }
    assert views.start_of(notice) == (world.NOW - timedelta(minutes=2)).timestamp()
    assert (
        views.start_of({**notice, "status": "scheduled"})
        == (world.NOW + timedelta(minutes=1)).timestamp()
    )
    assert render.relative(-125) == "2m 05s ago"
    assert render.relative(3 * 3600 + 60) == "in 3h 01m"
    assert render.relative(2 * 86400 + 3600) == "in 2d 01h"


def test_kinds_have_a_colour_each() -> None:
    text = files("bridge.fleet.web").joinpath("static/dashboard.css").read_text("utf-8")
    for kind in Kind:
        assert f".k-{kind.value} " in text or f".k-{kind.value}{{" in text, kind


def test_a_large_zone_stays_a_small_timeline() -> None:
    now = world.NOW.timestamp()

    def bar(name: str, status: str) -> views.Bar:
        return views.Bar(
            instance=name,
            notice_id="n",
            source=f"//vm/{name}",
            provider="gce",
            zone="z",
            kind="reboot",
            status=status,
            start=now - 3600,
            end=now,
            started=[now - 3600],
            completed=[now],
        )

    bars = [bar(f"vm-{i:03d}", "completed") for i in range(300)] + [bar("vm-zzz", "started")]
    zone_row = render.timeline_svg(bars, now, views.Filters())
    assert zone_row.count("<rect") == 2  # 300 windows on the same pixels, and one started
    assert "300 notices, reboot completed" in zone_row
    assert "301 x completed" in zone_row
    assert "301 x started" in zone_row
    per_instance = render.timeline_svg(bars, now, views.Filters(zone="z"))
    assert per_instance.count('class="row"') == render.MAX_TIMELINE_ROWS
    assert "/instances/vm-zzz" in per_instance  # a notice in force: drawn first
    assert f"{301 - render.MAX_TIMELINE_ROWS} more rows not drawn" in per_instance


async def test_without_identity_the_page_shows_a_dash_and_no_attestation_counts(
    web: httpx.AsyncClient,
) -> None:
    """A fleet whose sources check no identity: each instance's identity is "—" (unchecked),
    the headline has no attested/unattested counts and the form no identity filter; the
    filter still answers, and a bad value is 400 naming it."""
    found = await page(web, "/?q=db")
    assert found.tables["found"][0][5] == "Identity"
    assert {row[0]: row[5] for row in found.body("found")} == {"db-1": "—", "db-2": "—"}
    text = (await web.get("/")).text
    assert 'id="attested"' not in text
    assert 'id="f-attestation"' not in text
    unchecked = await page(web, "/?attestation=unchecked")
    assert len(unchecked.body("found")) == 5
    assert "found-empty" in (await page(web, "/?attestation=attested")).ids
    bad = await web.get("/?attestation=maybe")
    assert bad.status_code == 400
    assert bad.json()["error"].startswith("attestation: expected one of attested")
    instance = (await web.get("/instances/db-1")).text
    assert '<dd id="attestation"><span class="muted" title="identity not checked">—</span>' in (
        instance
    )
