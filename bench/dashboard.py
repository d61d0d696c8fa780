"""`python -m bench.dashboard [--quick] [--out DIR]`: the fleet dashboard with a big fleet.

The fleet of `bench.fleet` (10,000 instances, 100,000 events: heartbeats, two finished
notices per VM within the last 6 hours, one VM in 20 with a notice in force), ingested over
HTTP into a fleet service in its own process. Then:

- Server render time: the first `GET /` after the start (the service reads a week of the
  audit log into the timeline in the background from its start; the page waits for it two
  seconds at most), then `GET /` (everything), `GET /?zone=...` (one zone's drill-down),
  `GET /?q=...` (a search), `GET /?state=silent` (the silent instances, a page) and
  `GET /instances/<name>` (one VM's page), one at a time over a keep-alive connection,
  p50 and p99, and the page's size; then `GET /` again right after `GET /?zoom=month`,
  whose reach starts reading the timeline afresh in the background (as it is every hour),
  so while that runs.
- Page load in the browser: Debian's Chromium (Playwright, as in the tests) opens `/` in a
  fresh tab; milliseconds from navigation start until the first table (`#now`) is in the
  document, and until the load event. Skipped with a note when Chromium is not installed.

Writes `dashboard.md` in `--out` (default bench/results). Targets (issue 33's, which asks
them at 100,000 instances: `bench.fleet_scale` measures that size): `/` renders in under
300 ms at p99 and is usable (first table) in the browser in under 500 ms.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Final

import httpx
import psutil

from bench.fleet import (
    FULL,
    Sizes,
    _vm,
    bench_main,
    fleet_ingested,
    latency,
    store_counts,
    store_rows,
    targets_table,
)
from bench.stats import Summary, summarize
from bridge.fleet.state import zone_of

RENDER_TARGET_MS: Final = 300.0
REBUILDING: Final = "/ while the timeline is read afresh (after `?zoom=month`)"
LOAD_TARGET_MS: Final = 500.0
LOADS: Final = 10
#: Navigation start to the first table, and to the load event, of one page load.
_TIMING: Final = """() => {
  const nav = performance.getEntriesByType("navigation")[0];
  return [window.firstTableAt ?? nav.domInteractive, nav.loadEventEnd];
}"""
_MARK_FIRST_TABLE: Final = """
new MutationObserver((_, observer) => {
  if (document.getElementById("now") || document.getElementById("now-empty")) {
    window.firstTableAt = performance.now();
    observer.disconnect();
  }
}).observe(document, {childList: true, subtree: true});
"""


async def browser_loads(
    url: str, workdir: Path, loads: int, headers: dict[str, str] | None = None
) -> tuple[Summary, Summary] | None:
    """(first table, load event) in ms over `loads` page loads, sending `headers` (a read
    credential) with each request; None without Chromium."""
    from tests.fleet.chromium import CHROMIUM, chromium

    if not CHROMIUM.exists():
        return None
    first, loaded = [], []
    async with chromium(workdir / "chromium-profile") as context:
        await context.add_init_script(_MARK_FIRST_TABLE)
        if headers:
            await context.set_extra_http_headers(headers)
        for _ in range(loads + 1):  # the first warms the process up
            page = await context.new_page()
            await page.goto(url, wait_until="load")
            table, load = await page.evaluate(_TIMING)
            first.append(float(table))
            loaded.append(float(load))
            await page.close()
    return summarize(first[1:]), summarize(loaded[1:])


async def drawn(http: httpx.AsyncClient, zone: str, timeout: float = 120.0) -> None:
    """Until the page draws its whole timeline: the service read it at its start, before
    the fleet was posted, and reads it again in the background once it is that far behind
    (a zone's page, which draws its notices one by one, stops growing when that is done);
    the figures are of the page as it serves from then on."""
    deadline = time.monotonic() + timeout
    sizes: list[int] = []
    while time.monotonic() < deadline:
        text = (await http.get("/")).text
        if 'id="timeline-svg"' in text:
            sizes.append(len((await http.get(f"/?zone={zone}")).content))
            if len(sizes) >= 3 and sizes[-1] == sizes[-2] == sizes[-3]:
                return
        await asyncio.sleep(1.0)
    raise RuntimeError(f"the page drew no whole timeline within {timeout:g} s")


async def run(sizes: Sizes, workdir: Path) -> str:
    async with fleet_ingested(sizes, workdir, "bench.dashboard") as (url, _proc, _rate):
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            started = time.perf_counter()
            (await http.get("/")).raise_for_status()
            first_render = (time.perf_counter() - started) * 1000
            busy = _vm(20)
            await drawn(http, zone_of(busy.zone, busy.location) or "")
        paths = {
            "/ (the whole fleet)": "/",
            "/?zone=... (one zone, per instance)": f"/?zone={zone_of(busy.zone, busy.location)}",
            "/?q=... (a search)": f"/?q={busy.name[:-1]}",
            "/?state=silent (silent instances, a page)": "/?state=silent",
            "/instances/<name> (one VM)": f"/instances/{busy.name}",
        }
        rows = []
        for label, path in paths.items():
            print(f"[bench.dashboard] timing {label}", file=sys.stderr)
            summary, size = await latency(url, path, max(5, sizes.requests // 10))
            rows.append((label, summary, size))
        # A zoom reaching further back than the timeline read starts reading it afresh in
        # the background (as every hour does): `/` right after, while it reads.
        print(f"[bench.dashboard] timing {REBUILDING}", file=sys.stderr)
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            (await http.get("/?zoom=month")).raise_for_status()
        summary, size = await latency(url, "/", max(5, sizes.requests // 10))
        rows.insert(1, (REBUILDING, summary, size))
        print("[bench.dashboard] loading the page in Chromium", file=sys.stderr)
        browser = await browser_loads(url + "/", workdir, LOADS if sizes is FULL else 2)
        counts = await store_counts(url)
    return render(sizes, first_render, rows, browser, counts)


def render(
    sizes: Sizes,
    first_render: float,
    rows: list[tuple[str, Summary, int]],
    browser: tuple[Summary, Summary] | None,
    counts: dict[str, int],
) -> str:
    from bench.procs import commit

    # `/`, the worse of its two rows: as it renders, and while the timeline is read afresh.
    whole = max((r[1] for r in rows if r[0] in (rows[0][0], REBUILDING)), key=lambda s: s.p99)
    lines = [
        "# Fleet dashboard benchmark",
        "",
        f"{sizes.instances:,} instances, {sizes.events:,} events (`python -m bench.dashboard`); "
        "the fleet service in its own process, SQLite store.",
        "",
        *targets_table(
            [
                (
                    f"`/` server render p99 < {RENDER_TARGET_MS:g} ms (the worse of its rows)",
                    f"{whole.p99:.0f} ms",
                    whole.p99 < RENDER_TARGET_MS,
                ),
                *(
                    [
                        (
                            f"`/` in Chromium, first table p99 < {LOAD_TARGET_MS:g} ms",
                            f"{browser[0].p99:.0f} ms",
                            browser[0].p99 < LOAD_TARGET_MS,
                        )
                    ]
                    if browser is not None
                    else []
                ),
            ]
        ),
    ]
    lines += [
        "",
        "## Server render",
        "",
        "| page | p50 ms | p99 ms | max ms | bytes |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, summary, size in rows:
        lines.append(
            f"| {label} | {summary.p50:.0f} | {summary.p99:.0f} | {summary.max:.0f} | {size:,} |"
        )
    lines += [
        "",
        f"The first render after the service starts: {first_render:,.0f} ms (the timeline is "
        "read from the audit log in the background from the start; a render waits for it "
        "two seconds at most, and later renders read only the events since).",
        "",
        "## Page load in Chromium",
        "",
    ]
    if browser is None:
        lines.append("Not measured: Chromium is not installed (`apt-get install chromium`).")
    else:
        first, loaded = browser
        lines += [
            "| from navigation start to | p50 ms | p99 ms | max ms |",
            "| --- | --- | --- | --- |",
            f"| the first table (`#now`) | {first.p50:.0f} | {first.p99:.0f} | {first.max:.0f} |",
            f"| the load event | {loaded.p50:.0f} | {loaded.p99:.0f} | {loaded.max:.0f} |",
        ]
    lines += [
        "",
        f"Store rows: {store_rows(counts)}.",
        "",
        f"Commit measured: {commit()}. Host: {os.cpu_count()} CPUs, load average "
        f"{psutil.getloadavg()[0]:.1f} at the end.",
        "",
    ]
    return "\n".join(lines)


main = bench_main("dashboard", __doc__, run)


if __name__ == "__main__":
    sys.exit(main())
