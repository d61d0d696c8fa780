"""A fleet migrating to instance identity (`identity = "optional"`, #34), seen in a real
headless Chromium: two real sidecars post to a real fleet service, `web-1` (GCE) enrolled
with its simulated VM's signed identity token, `db-1` (Azure) not yet. The page counts the
attested and unattested instances in its headline, lists the unattested ones from there,
filters by identity in its form, and shows each instance's identity on its page.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import httpx
import pytest
from playwright.async_api import BrowserContext, ConsoleMessage, expect

from bridge.app.fleet_demo import identity_table
from bridge.simulator import Simulator
from bridge.simulator.attestation import Signer
from tests.fleet.chromium import browser
from tests.fleet.conftest import SECRET, FleetFactory
from tests.fleet.test_dashboard_browser import sidecars
from tests.support import eventually

__all__ = ["browser"]  # the fixture, imported to be found

pytestmark = pytest.mark.slow

WAIT: Final = 30_000
expect.set_options(timeout=WAIT)


async def attestation_counts(url: str, attested: int, unattested: int) -> None:
    async def ready() -> bool:
        async with httpx.AsyncClient(base_url=url) as http:
            summary = (await http.get("/v1/fleet/summary")).json()
        counts = summary["instances"]["by_attestation"]
        return bool(counts["attested"] == attested and counts["unattested"] == unattested)

    await eventually(ready, timeout=60)


async def test_the_page_shows_which_instances_are_attested(
    fleet_service: FleetFactory, browser: BrowserContext, tmp_path: Path
) -> None:
    signer = Signer()
    optional = [{"type": "http", "secrets": [SECRET], "identity": "optional"}]
    async with (
        fleet_service(sources=optional, identity=identity_table(tmp_path, signer)) as service,
        Simulator("gce", identity={"gce": {"instance_name": "web-1"}}) as web1,
        Simulator("azure", identity={"azure": {"name": "db-1"}}) as db1,
    ):
        web1.signer = db1.signer = signer
        async with sidecars(
            service, tmp_path, ("gce", web1, "web-1"), ("azure", db1, "db-1"), enrolled={"web-1"}
        ):
            await attestation_counts(service.url, attested=1, unattested=1)

            page = await browser.new_page()
            errors: list[str] = []

            def console(message: ConsoleMessage) -> None:
                if message.type == "error":
                    errors.append(message.text)

            page.on("console", console)
            await page.goto(service.url + "/")
            await expect(page.locator("#attested")).to_have_text("1")
            await expect(page.locator("#unattested")).to_have_text("1")

            # From the headline to the instances still to move.
            await page.click("#unattested a")
            await expect(page).to_have_url(service.url + "/?attestation=unattested")
            rows = page.locator("#found tbody tr")
            await expect(rows).to_have_count(1)
            await expect(rows.first.locator("th")).to_have_text("db-1")
            await expect(rows.first.locator(".badge")).to_have_text("unattested")
            await expect(page.locator("#f-attestation")).to_have_value("unattested")

            # The form's identity filter, chosen: the attested ones.
            await page.select_option("#f-attestation", "attested")
            await page.click("form.filters button[type=submit]")
            await expect(page).to_have_url(service.url + "/?attestation=attested")
            await expect(rows).to_have_count(1)
            await expect(rows.first.locator("th")).to_have_text("web-1")
            await expect(rows.first.locator(".badge.attested")).to_have_text("attested")

            # Each instance's page says it too.
            await page.click("#found tbody a:text-is('web-1')")
            await expect(page.locator("#instance-name")).to_have_text("web-1")
            await expect(page.locator("#attestation")).to_have_text("attested")
            await page.goto(service.url + "/instances/db-1")
            await expect(page.locator("#attestation")).to_have_text("unattested")
            await page.close()
            assert errors == []
