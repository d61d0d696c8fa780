"""The README's dashboard screenshot, made from the fleet demo so it cannot go stale.

`make screenshot` (`python -m bench.screenshot`):

1. runs `maintenance-bridge demo --fleet` (the command a new user runs: simulated VMs,
   real sidecars, a real fleet service) and reads that service's audit log
   (`GET /v1/fleet/events`, page after page) while the scenario plays, until the demo ends;
2. posts those events, as received, into a fleet service of its own (`POST /v1/events`),
   which keeps serving: the demo's service stops with its scenario;
3. opens that service's page in headless Chromium (Debian's, through Playwright, as the
   dashboard tests do) at a laptop's width and at a phone's, and saves
   `docs/img/dashboard.png` and `docs/img/dashboard-phone.png`.

So the picture shows what the demo shows: its five VMs, its notices, its timeline. The
events keep their times, and the shot is taken seconds after the demo, so the countdowns and
the timeline read as they did live.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
import tempfile
from pathlib import Path
from typing import Final

import httpx
import msgspec

from bridge.fleet.config import parse_fleet_config
from bridge.fleet.service import FleetService

ROOT: Final = Path(__file__).resolve().parents[1]
IMAGES: Final = ROOT / "docs" / "img"
#: The demo's speed: 1, as `make demo-fleet` plays it (its countdowns read as a user sees
#: them); `--speed 10` for a quick check.
SPEED: Final = 1.0
#: Seconds the demo may take from start to end.
DEMO_TIMEOUT: Final = 180.0
_URL: Final = re.compile(r"fleet service at (http://[^\s:]+:\d+)")
_BATCH: Final = {"content-type": "application/cloudevents-batch+json"}
SIZES: Final = {"dashboard.png": (1280, 900), "dashboard-phone.png": (390, 844)}


async def _demo_url(process: asyncio.subprocess.Process) -> str:
    """The demo's fleet service URL, from the line it prints when it listens."""
    assert process.stderr is not None
    while line := await process.stderr.readline():
        found = _URL.search(line.decode(errors="replace"))
        if found:
            return found.group(1)
    raise RuntimeError(f"the demo ended without a fleet service (exit {await process.wait()})")


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


async def demo_events(speed: float = SPEED) -> list[bytes]:
    """Every event the demo's fleet service received, in its audit log's order."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge",
        "demo",
        "--fleet",
        "--no-keep",  # the demo serves on after its scenarios; this script needs them only
        "--speed",
        str(speed),
        cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    events: list[bytes] = []
    try:
        url = await asyncio.wait_for(_demo_url(process), DEMO_TIMEOUT)
        assert process.stderr is not None
        drain = asyncio.create_task(_drain(process.stderr))  # the demo's log, not to block it
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            while process.returncode is None:
                try:
                    events = await _audit_log(http) or events
                except httpx.HTTPError:
                    break  # the demo's service stopped (or is stopping): its scenario is over
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), 0.2)
        await asyncio.wait_for(process.wait(), DEMO_TIMEOUT)
        drain.cancel()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"the demo failed (exit {process.returncode})")
    return events


async def _audit_log(http: httpx.AsyncClient) -> list[bytes]:
    """The whole audit log, page after page (the demo's is a few hundred events: read again
    at every poll, it is complete up to the last poll before the demo's service stops)."""
    events: list[bytes] = []
    params: dict[str, str] = {}
    while True:
        answer = await http.get("/v1/fleet/events", params=params)
        answer.raise_for_status()
        events.extend(_split(answer.content))
        following = answer.headers.get("Fleet-Next-Cursor")
        if following is None:
            return events
        params = {"cursor": following}


def _split(batch: bytes) -> list[bytes]:
    """The events of a CloudEvents batch, each as its exact bytes."""
    return [bytes(raw) for raw in msgspec.json.decode(batch, type=list[msgspec.Raw])]


async def shoot(events: list[bytes], out: Path) -> list[Path]:
    """Serve `events` in a fresh fleet service and photograph its page."""
    from tests.fleet.chromium import CHROMIUM, chromium

    if not CHROMIUM.exists():
        raise RuntimeError(f"Chromium is needed at {CHROMIUM}: `apt-get install chromium`")
    with tempfile.TemporaryDirectory(prefix="maintenance-bridge-screenshot-") as tmp:
        config = parse_fleet_config(
            {
                "fleet": {
                    "listener": {"port": 0},
                    "store": {"url": f"sqlite://{Path(tmp) / 'fleet.sqlite3'}"},
                    "sources": [{"type": "http"}],  # unsigned: loopback only
                }
            }
        )
        saved = []
        async with (
            FleetService(config).running() as service,
            httpx.AsyncClient(base_url=service.url) as http,
        ):
            for start in range(0, len(events), 100):
                body = b"[" + b",".join(events[start : start + 100]) + b"]"
                answer = await http.post("/v1/events", content=body, headers=_BATCH)
                answer.raise_for_status()
            summary = (await http.get("/v1/fleet/summary")).json()
            print(
                f"the page shows {summary['instances']['reporting']} instances reporting, "
                f"{summary['notices_in_force']['total']} notices in force",
                file=sys.stderr,
            )
            async with chromium(Path(tmp) / "chromium-profile") as context:
                page = await context.new_page()
                for name, (width, height) in SIZES.items():
                    await page.set_viewport_size({"width": width, "height": height})
                    await page.goto(service.url + "/")
                    await page.wait_for_selector("#live-status:text('live')")
                    await page.screenshot(path=str(out / name), full_page=True)
                    saved.append(out / name)
    return saved


async def run(out: Path, speed: float) -> list[Path]:
    events = await demo_events(speed)
    print(f"the demo's fleet received {len(events)} events", file=sys.stderr)
    return await shoot(events, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.screenshot",
        description="Run the fleet demo and photograph its dashboard for the README.",
    )
    parser.add_argument("--out", type=Path, default=IMAGES, help="default: docs/img")
    parser.add_argument("--speed", type=float, default=SPEED, help="the demo's speed")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        saved = asyncio.run(run(args.out, args.speed))
    except RuntimeError as exc:
        print(f"screenshot: {exc}", file=sys.stderr)
        return 1
    for path in saved:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
