"""The fleet page passes axe-core, the accessibility checker the project's reviewers use.

A real `maintenance-bridge fleet` child process (tests/fleet/test_auth.py's `Fleet`: SQLite
store, a `read` credential, so the page asks to sign in) holds the shared fleet
(tests/fleet/world.py: notices in force, one instance silent) posted through
`POST /v1/events`, and retires `quiet-1` on its own retention pass, so every part of the
page is drawn: the headline with its retired figure, the tables by provider and zone, the
notices, the timeline, a search's instances, an instance's history. Debian's Chromium
(tests/fleet/chromium.py) signs in through the form and opens each view; axe-core's
`axe.min.js` is injected (tests/fleet/axe.py installs it with npm) and `axe.run()` checks the
whole document, in the light and the dark scheme (their colours differ). A violation of
impact "serious" or "critical" fails the test; the message lists every violation found.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final, Literal

import httpx
import pytest
from playwright.async_api import BrowserContext, Page, expect

from tests.fleet import axe, world
from tests.fleet.chromium import browser
from tests.fleet.factories import gce_vm, heartbeat
from tests.fleet.test_auth import INGEST_TOKEN, READ_TOKEN, Fleet, bearer
from tests.fleet.test_dashboard import BATCH
from tests.fleet.world import FLEET
from tests.support import eventually

__all__ = ["browser"]  # the fixture, imported to be found

pytestmark = pytest.mark.slow

#: The views a person on call opens: the whole fleet, one zone, the silent instances (a
#: search's table), one instance's history.
VIEWS: Final = (
    "/",
    "/?zone=us-central1-a",
    "/?state=silent",
    "/?q=db",
    "/instances/db-2",
)
WAIT: Final = 30_000
SCHEMES: Final[tuple[Literal["light", "dark"], ...]] = ("light", "dark")


#: Anything silent for 30 minutes retires (the world's `quiet-1`, last heard an hour ago),
#: checked every second; the page and the API need a `read` credential.
CONFIG: Final = f"""
[fleet.retention]
retire_after_days = {30 / (24 * 60)}
interval = 1
[fleet.auth]
[[fleet.auth.credentials]]
name = "on-call"
scopes = ["read"]
token = "{READ_TOKEN}"
[[fleet.auth.credentials]]
name = "sidecars"
scopes = ["ingest"]
token = "{INGEST_TOKEN}"
"""


@pytest.fixture
async def fleet_url(tmp_path: Path) -> AsyncIterator[str]:
    """The fleet service's address once it holds the fleet, `lull-1` silent (heard 10
    minutes ago) and `quiet-1` retired."""
    axe.axe_or_skip()  # before starting anything: skip (or fail under CI) early
    lull = heartbeat(gce_vm("lull-1"), world.minutes(-10))
    with Fleet(tmp_path, CONFIG).running() as fleet:
        async with httpx.AsyncClient(base_url=fleet.url) as http:
            answer = await http.post(
                "/v1/events",
                content=b"[" + b",".join([*FLEET, lull]) + b"]",
                headers={**BATCH, **bearer(INGEST_TOKEN)},
            )
            assert answer.status_code == 200, answer.text

            async def retired() -> bool:
                summary = await http.get("/v1/fleet/summary", headers=bearer(READ_TOKEN))
                return bool(summary.json()["instances"]["retired"] == 1)

            await eventually(retired, timeout=30)
        yield fleet.url


async def checked(page: Page, url: str) -> dict[str, Any]:
    """`axe.run()`'s results for the page at `url`, once its script has run."""
    answer = await page.goto(url, wait_until="load", timeout=WAIT)
    assert answer is not None
    assert answer.status == 200, url
    await page.add_script_tag(path=str(axe.axe_or_skip()))
    results: dict[str, Any] = await page.evaluate("() => axe.run(document)")
    assert results["passes"], f"axe checked nothing on {url}"
    await svg_text_is_readable(page)
    return results


def luminance(rgb: str) -> float:
    """WCAG 2's relative luminance of a computed colour, `rgb(r, g, b)`."""
    channels = [int(n) / 255 for n in re.findall(r"\d+", rgb)[:3]]
    r, g, b = (c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


async def svg_text_is_readable(page: Page) -> None:
    """The timeline's labels are SVG text, whose colour is its `fill`: axe leaves their
    contrast for a person to review ("incomplete"), so it is checked here, against the
    page's background, with WCAG's 4.5:1 for normal text."""
    fills: list[str] = await page.eval_on_selector_all(
        "svg text", "nodes => nodes.map(n => getComputedStyle(n).fill)"
    )
    background: str = await page.evaluate("getComputedStyle(document.body).backgroundColor")
    for fill in set(fills):
        light, dark = sorted((luminance(fill), luminance(background)), reverse=True)
        ratio = (light + 0.05) / (dark + 0.05)
        assert ratio >= 4.5, f"SVG text {fill} on {background}: contrast {ratio:.2f} < 4.5"


async def test_the_fleet_page_has_no_serious_accessibility_violations(
    fleet_url: str, browser: BrowserContext
) -> None:
    page = await browser.new_page()
    found: dict[str, list[dict[str, Any]]] = {}
    for scheme in SCHEMES:  # signed out: `/` answers with the sign-in form
        await page.emulate_media(color_scheme=scheme)
        found[f"{scheme} /signin"] = (await checked(page, fleet_url + "/"))["violations"]
    # Through the form, finding its field by the label: the cookie holds for the rest.
    await page.get_by_label("Token").fill(READ_TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#reporting")).to_have_text("4", timeout=WAIT)
    for scheme in SCHEMES:
        await page.emulate_media(color_scheme=scheme)
        for view in VIEWS:
            found[f"{scheme} {view}"] = (await checked(page, fleet_url + view))["violations"]
    failed = [where for where, violations in found.items() if axe.failing(violations)]
    listing = "\n".join(
        f"{where}:" + "".join(f"\n  {axe.described(v)}" for v in violations)
        for where, violations in found.items()
    )
    assert not failed, f"serious or critical violations on {failed}:\n{listing}"
