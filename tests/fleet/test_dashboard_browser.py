"""The fleet dashboard in a real headless Chromium, over a fleet fed by real sidecars.

Three simulated VMs (Azure `db-1` and `db-2`, GCE `web-1`), each watched by a real bridge
(watcher, SQLite spool, dispatcher) whose webhook sink posts signed batches to a real fleet
service. The browser sees what an operator on call sees: the notice in force with a ticking
countdown, a new notice appearing without a reload, a filter that narrows the table and
survives a reload, an instance's history, a phone width and the dark scheme; the console
stays free of errors. Screenshots go to tests/artifacts/dashboard/ (git-ignored).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Collection
from pathlib import Path
from typing import Any, Final, Literal

import httpx
import pytest
from playwright.async_api import BrowserContext, ConsoleMessage, Error, Page, expect

from bridge.app.fleet_demo import vm_bridge as fleet_bridge
from bridge.fleet.service import FleetService
from bridge.pipeline.model import Status
from bridge.simulator import Simulator
from tests.fleet import world
from tests.fleet.chromium import ARTIFACTS, browser
from tests.fleet.conftest import SECRET, FleetFactory
from tests.fleet.factories import transition
from tests.fleet.world import minutes
from tests.support import eventually

__all__ = ["browser"]  # the fixture, imported to be found

pytestmark = pytest.mark.slow

#: Playwright's waits (ms): generous, the machine is shared.
WAIT: Final = 30_000
expect.set_options(timeout=WAIT)


@contextlib.asynccontextmanager
async def sidecars(
    service: FleetService,
    root: Path,
    *sims: tuple[Literal["gce", "azure"], Simulator, str],
    enrolled: Collection[str] = (),
) -> AsyncIterator[None]:
    """One real bridge per simulated VM, posting to the fleet's POST /v1/events; those
    named in `enrolled` enroll first (instance identity) and post with their credential."""
    bridges = []
    for provider, sim, name in sims:
        source: dict[str, Any] = (
            {"metadata_url": sim.gce_url}
            if provider == "gce"
            else {"imds_url": sim.azure_url, "poll_interval": 0.5}
        )
        enroll = name in enrolled
        bridges.append(
            fleet_bridge(provider, source, root / name, service.url, SECRET, enroll=enroll)
        )
    stops = [asyncio.Event() for _ in bridges]
    tasks = [asyncio.create_task(b.run(s)) for b, s in zip(bridges, stops, strict=True)]
    try:
        yield
    finally:
        for stop in stops:
            stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


async def fleet_holds(url: str, instances: int, notices: int) -> None:
    async def ready() -> bool:
        async with httpx.AsyncClient(base_url=url) as http:
            summary = (await http.get("/v1/fleet/summary")).json()
        return bool(
            summary["instances"]["reporting"] == instances
            and summary["notices_in_force"]["total"] == notices
        )

    await eventually(ready, timeout=60)


async def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


async def test_the_dashboard_live_in_chromium(
    fleet_service: FleetFactory, browser: BrowserContext, tmp_path: Path
) -> None:
    azure = {"resource_group_name": "shop-rg", "zone": "2"}
    async with (
        fleet_service(sources=[{"type": "http", "secrets": [SECRET]}]) as service,
        Simulator("azure", identity={"azure": {"name": "db-1", **azure}}) as db1,
        Simulator("azure", identity={"azure": {"name": "db-2", **azure}}) as db2,
        Simulator("gce", identity={"gce": {"instance_name": "web-1"}}) as web1,
        sidecars(
            service,
            tmp_path,
            ("azure", db1, "db-1"),
            ("azure", db2, "db-2"),
            ("gce", web1, "web-1"),
        ),
    ):
        db1.azure.add_event(event_type="Redeploy", not_before_in=3600)
        web1.gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
        await fleet_holds(service.url, instances=3, notices=2)

        page = await browser.new_page()
        errors: list[str] = []

        def console(message: ConsoleMessage) -> None:
            if message.type == "error":
                errors.append(message.text)

        def crash(error: Error) -> None:
            errors.append(f"uncaught: {error}")

        page.on("console", console)
        page.on("pageerror", crash)
        await page.goto(service.url + "/")
        now_rows = page.locator("#now tbody tr")
        await expect(now_rows).to_have_count(2)
        await expect(now_rows.nth(0)).to_contain_text("web-1")  # under way: first
        await expect(now_rows.nth(0)).to_contain_text("live-migrate")
        await expect(now_rows.nth(0)).to_contain_text(" ago")  # counted from its start
        await expect(now_rows.nth(1)).to_contain_text("db-1")
        await expect(now_rows.nth(1)).to_contain_text("redeploy")
        await expect(page.locator("#reporting")).to_have_text("3")
        await expect(page.locator("#started")).to_have_text("1")

        # The countdown ticks by itself.
        countdown = now_rows.nth(1).locator("time[data-countdown]")
        before = await countdown.text_content()
        assert before is not None
        assert before.startswith("in ")
        await expect(countdown).not_to_have_text(before)

        # A new notice arrives through db-2's sidecar: it shows up without a reload.
        await page.evaluate("window.notReloaded = true")
        db2.azure.add_event(event_type="Freeze", not_before_in=600)
        await expect(now_rows).to_have_count(3)
        await expect(now_rows.nth(1)).to_contain_text("db-2")  # soonest first
        assert await page.evaluate("window.notReloaded") is True
        await expect(page.locator("#live-status")).to_have_text("· live")
        await shot(page, "dashboard")

        # A filter narrows the table, lives in the URL and survives a reload.
        await page.fill("#f-q", "db-2")
        await page.click("form.filters button[type=submit]")
        await expect(page).to_have_url(service.url + "/?q=db-2")
        await expect(now_rows).to_have_count(1)
        await expect(now_rows.first).to_contain_text("db-2")
        await page.reload()
        await expect(now_rows).to_have_count(1)
        await expect(page.locator("#f-q")).to_have_value("db-2")
        await page.select_option("#f-provider", "gce")  # chosen means submitted
        await expect(page).to_have_url(service.url + "/?provider=gce&q=db-2")
        await expect(page.locator("#now-empty")).to_be_visible()

        # The instance page: its state, eligibility and history.
        await page.goto(service.url + "/")
        await page.click("#now tbody a:text-is('db-1')")
        await expect(page.locator("#instance-name")).to_have_text("db-1")
        await expect(page.locator("#sidecar-state")).to_contain_text("reporting")
        await expect(page.locator("#history tbody tr")).to_have_count(1)
        await expect(page.locator("#history")).to_contain_text("maintenance.scheduled")
        await expect(page.locator("#history")).to_contain_text("redeploy scheduled")
        await shot(page, "instance")

        # A phone's width: nothing wider than the screen (tables scroll inside their box).
        await page.set_viewport_size({"width": 390, "height": 844})
        await page.goto(service.url + "/")
        await expect(now_rows).to_have_count(3)
        overflow = await page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0
        await shot(page, "phone")

        # Light and dark follow the reader's preference.
        background = "getComputedStyle(document.body).backgroundColor"
        await page.emulate_media(color_scheme="light")
        light = await page.evaluate(background)
        await page.emulate_media(color_scheme="dark")
        dark = await page.evaluate(background)
        assert light != dark
        await shot(page, "phone-dark")

        await page.close()
        assert errors == []


async def box(locator: Any) -> dict[str, float]:
    found = await locator.bounding_box()
    assert found is not None, locator
    return dict(found)


async def inside_the_screen(locator: Any, width: float = 390) -> bool:
    """Whether the element is laid out within the screen's width (no sideways scroll)."""
    found = await box(locator)
    return found["x"] >= 0 and found["x"] + found["width"] <= width + 0.5


async def test_the_page_on_a_phone_and_the_timeline_zoom(
    fleet_service: FleetFactory, browser: BrowserContext
) -> None:
    """390 x 844 (a phone): every column of a notice is on screen, the timeline opens on now
    and the days to come with its row names beside it; the zoom lives in the URL."""
    later = world.DB2
    async with fleet_service() as service, httpx.AsyncClient(base_url=service.url) as http:
        five_days = transition(
            later, "ev-9", Status.SCHEDULED, minutes(-1), not_before=minutes(7200)
        )
        body = b"[" + b",".join([*world.FLEET, five_days]) + b"]"
        headers = {"content-type": "application/cloudevents-batch+json"}
        assert (await http.post("/v1/events", content=body, headers=headers)).status_code == 200

        page = await browser.new_page()
        await page.set_viewport_size({"width": 390, "height": 844})
        await page.goto(service.url + "/")
        rows = page.locator("#now tbody tr")
        await expect(rows).to_have_count(5)
        assert (
            await page.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            <= 0
        )
        # A card per notice: the instance and its zone are on screen, labelled.
        first = rows.nth(1)  # db-1, scheduled in 10 minutes
        for cell, text in (("th", "db-1"), ("td.zone", "westeurope-1")):
            located = first.locator(cell)
            await expect(located).to_be_visible()
            await expect(located).to_contain_text(text)
            assert await inside_the_screen(located), cell
        label = await first.locator("td.zone").evaluate(
            "cell => getComputedStyle(cell, '::before').content"
        )
        assert label == '"Zone"'

        # The timeline: opens on now, with what is coming; the names stay while it scrolls.
        plot = page.locator("#timeline-plot")
        await plot.scroll_into_view_if_needed()
        now_line = page.locator("#timeline-svg line.now")
        assert await inside_the_screen(now_line)
        names = page.locator(".tl-labels a.row")
        await expect(names.first).to_be_visible()
        assert await inside_the_screen(names.first)
        coming = page.locator("#timeline-svg rect.s-scheduled").last  # ev-9, in 5 days
        await coming.scroll_into_view_if_needed()
        assert await inside_the_screen(coming)
        await plot.evaluate("plot => { plot.scrollLeft = plot.scrollWidth; }")
        end = page.locator("#timeline-svg text.tick").last
        await expect(end).to_have_text("+7d")
        assert await inside_the_screen(end)
        assert await inside_the_screen(names.first)  # still beside the drawing
        await shot(page, "phone-timeline")

        # Zoom: a day, kept in the URL, by a filter and by a reload; a month reaches ev-9 too.
        await page.click(".zoom a[data-zoom=day]")
        await expect(page).to_have_url(service.url + "/?zoom=day")
        await expect(page.locator("#h-timeline")).to_contain_text("last 24 hours")
        await expect(page.locator("#timeline-svg text.tick").last).to_have_text("+24h")
        await page.select_option("#f-provider", "azure")
        await expect(page).to_have_url(service.url + "/?provider=azure&zoom=day")
        await page.reload()
        await expect(page.locator(".zoom strong")).to_have_text("day")
        await page.click(".zoom a[data-zoom=month]")
        await expect(page).to_have_url(service.url + "/?provider=azure&zoom=month")
        await expect(page.locator("#timeline-svg text.tick").last).to_have_text("+30d")
        await shot(page, "phone-month")

        # The instance page: one heartbeat age, the detail wrapped (no cell off screen).
        await page.goto(service.url + "/instances/db-2")
        await expect(page.locator("#heartbeat time")).to_contain_text("ago")
        await expect(page.locator("#sidecar-state")).to_have_text("reporting")
        assert "ago" not in (await page.locator("#sidecar-state").text_content() or "")
        detail = page.locator("#history td.detail").first
        await expect(detail).to_contain_text("scheduled")
        assert await inside_the_screen(detail)
        await page.close()
