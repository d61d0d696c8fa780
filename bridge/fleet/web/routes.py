"""The dashboard's routes on the fleet service's listener.

- `GET /`: the fleet page (filters `provider`, `zone`, `kind`, `status`, `q`, `attestation`
  and the timeline's `zoom` in the URL; an unknown zoom, status or attestation is 400 naming
  the choices, like a bad `days`). At 100,000 instances it summarizes (counts kept by the
  store), pages the notices in force (`cursor`) and lists the instances a search `q` or an
  `attestation` finds (`icursor`).
- `GET /instances/{name}`: one instance: state, eligibility, heartbeat, its history (`days`,
  default 7).
- `GET /dashboard/version`: a small token that changes when the store does (and once a
  minute, as time moves notices from "coming" to "now"); `dashboard.js` polls it and
  re-fetches the page only when it changed, so an idle dashboard costs a COUNT, not a render.
- `GET /static/...`: the CSS and the JavaScript, from the package (no CDN, works
  air-gapped).

Reads only: the page asks the store the same questions as `/v1/fleet/...`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from importlib.resources import files
from typing import Any, Final

import msgspec
from aiohttp import web

from bridge import contract
from bridge.fleet import paging, rollout, state
from bridge.fleet.api import BadQuery
from bridge.fleet.store import ATTESTATIONS, EventQuery, InstanceQuery, NoticeFilter, Store
from bridge.fleet.web import render, views

#: The most events an instance's history reads (a bound on one render).
MAX_EVENTS: Final = 50_000
#: How far back an instance's history may reach, days.
MAX_DAYS: Final = 366
#: Audit-log rows per read while the timeline catches up.
PAGE: Final = 10_000
#: The first timeline reads the audit log an hour of one event type at a time, in
#: pages of this many rows, and adds them to the timeline `BUILD_SLICE` rows at a time.
BUILD_SPAN: Final = 3600.0
BUILD_PAGE: Final = 500
BUILD_SLICE: Final = 100
#: Seconds a slice of the rebuild waits for the renders under way, at most: renders back
#: to back still let it read a slice this often (one slice costs a render 1 to 2 ms).
IDLE_WAIT: Final = 0.02
#: Seconds the first page waits for the first timeline (then it says it is being read).
FIRST_WAIT: Final = 2.0
#: Events a render reads to bring the timeline up to date, at most; further behind (an
#: idle page, a burst), the timeline is read afresh in the background instead.
CATCH_UP: Final = 50_000
log = logging.getLogger("bridge.fleet.web")
_STATIC: Final = {
    "dashboard.css": "text/css",
    "dashboard.js": "text/javascript",
}
_HTML: Final = "text/html"


class DashboardRoutes:
    """The HTML views over one store; `horizon` is the eligibility horizon of the API."""

    def __init__(self, store: Store, horizon: float) -> None:
        self.store = store
        self.horizon = horizon
        self.timeline = views.Timeline()
        self._lock = asyncio.Lock()
        #: A timeline being read afresh, in the background.
        self._building: asyncio.Task[views.Timeline] | None = None
        #: Pages being rendered; the rebuild waits for none (`_idle`).
        self._rendering = 0
        self._quiet = asyncio.Event()
        self._quiet.set()

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/", self.index)
        app.router.add_get("/instances/{name}", self.instance)
        app.router.add_get("/dashboard/version", self.version)
        app.router.add_get("/static/{file}", self.static)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)

    async def _version(self, now: float) -> str:
        counts = await self.store.counts()
        return f"{counts['events']}.{counts['rejected']}.{int(now // 60)}"

    async def version(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {"version": await self._version(time.time())}, headers={"Cache-Control": "no-store"}
        )

    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["file"]
        if name not in _STATIC:
            raise web.HTTPNotFound()
        body = files("bridge.fleet.web").joinpath(f"static/{name}").read_bytes()
        return web.Response(
            body=body,
            content_type=_STATIC[name],
            charset="utf-8",
            headers={"Cache-Control": "max-age=300"},
        )

    @staticmethod
    def _options(
        groups: list[tuple[str, str, str, str, int]],
        instances: list[views.FleetRow],
    ) -> dict[str, list[str]]:
        """The filters' choices: what the store counts (notices in force, instances)."""
        providers = {g[0] for g in groups} | {i[0] for i in instances}
        zones = {g[1] for g in groups if g[1]} | {i[2] for i in instances if i[2]}
        kinds = {g[2] for g in groups}
        return {
            "provider": sorted(providers),
            "zone": sorted(zones),
            "kind": sorted(kinds),
            "status": list(state.IN_FORCE),
            "state": list(views.INSTANCE_STATES),
        }

    async def _start(self, _app: web.Application) -> None:
        """Begin reading the timeline as the service starts, so the first page does not."""
        self._rebuild(time.time(), self.timeline.reach)

    async def _stop(self, _app: web.Application) -> None:
        if self._building is not None:
            self._building.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._building

    def _rebuild(self, now: float, reach: float) -> None:
        if self._building is None:
            self._building = asyncio.create_task(self._build(now, reach))

    async def _idle(self) -> None:
        """Until no page (`/`, an instance's) is being rendered, then a turn of the loop:
        the rebuild's every read and slice waits here, so a render never queues behind it
        for the store's reader or for the interpreter for longer than one slice. Not for
        longer than `IDLE_WAIT` either: renders back to back do not starve it."""
        if not self._quiet.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._quiet.wait(), IDLE_WAIT)
        await asyncio.sleep(0)

    async def _sliced(
        self, fn: Callable[[views.Timeline, Any], None], fresh: views.Timeline, rows: list[Any]
    ) -> None:
        """`fn(fresh, rows)` `BUILD_SLICE` rows at a time, each after `_idle`. On the loop,
        not in a worker thread: decoding is Python, and a thread decoding beside the loop
        took the interpreter from the renders for its switch interval at a time (the 300 ms
        tail of the page at 10,000 VMs while the timeline was read afresh)."""
        for start in range(0, len(rows), BUILD_SLICE):
            await self._idle()
            fn(fresh, rows[start : start + BUILD_SLICE])

    async def _build(self, now: float, reach: float) -> views.Timeline:
        """A timeline read afresh (see `views.Timeline`): the maintenance events of its
        reach, type by type through the audit log's (type, time) index - a week of a large
        fleet's audit log is mostly heartbeats, which draw nothing - then the notices in
        force as the store holds them. Small reads and slices that give way to renders
        (`_idle`), so the service answers meanwhile; the page draws the old timeline until
        this one is done."""
        fresh = views.Timeline(built_at=now, reach=reach)
        fresh.counting = False  # counted once at the end, not per event
        cursor = await self.store.last_sequence()
        for kind in contract.MAINTENANCE_TYPES:
            since = now - reach
            await self._idle()
            first = await self.store.events(EventQuery(type=kind, since=since, limit=BUILD_PAGE))
            if first.next_cursor is None:  # a small store: all of them at once
                await self._sliced(_add_rows, fresh, first.rows)
                continue
            while True:
                # An hour of one type per query, small pages: each read is short, so the
                # API's reads (one reader on SQLite) get their turn in between.
                until = since + BUILD_SPAN if since + BUILD_SPAN < now else None
                query = EventQuery(type=kind, since=since, until=until, limit=BUILD_PAGE)
                while True:
                    await self._idle()
                    page = await self.store.events(query)
                    await self._sliced(_add_rows, fresh, page.rows)
                    if page.next_cursor is None:
                        break
                    query = replace(query, cursor=page.next_cursor)
                if until is None:
                    break
                since = until
        following: str | None = None
        while True:
            await self._idle()
            notices = await self.store.notice_page(
                NoticeFilter(), cursor=following, limit=BUILD_PAGE
            )
            await self._sliced(_seed, fresh, notices.rows)
            if notices.next is None:
                break
            following = notices.next
        # Later renders read on from the audit log's end as it was before the rebuild's
        # reads (an event committed meanwhile is read twice; its mark counts once).
        fresh.cursor = cursor
        await self._sliced(views.Timeline.count, fresh, list(fresh.bars.values()))
        fresh.counting = True
        return fresh

    async def _timeline(self, now: float, zoom: views.Zoom) -> views.Timeline | None:
        """The kept timeline, brought up to date with the events after its cursor; a new
        one is built in the background when it is due (`views.Timeline.stale`), or when
        the audit log ran further ahead than `CATCH_UP` events (an idle page an hour
        later). None while the first one is still being read."""
        async with self._lock:
            if self.timeline.stale(now, zoom.half):
                self._rebuild(now, max(zoom.half, self.timeline.reach))
            building = self._building
            if building is not None and not self.timeline.built_at:
                # The first timeline: worth a short wait (a small store reads in no time),
                # during which this render does not hold the rebuild back.
                with self._render(-1):
                    await asyncio.wait([building], timeout=FIRST_WAIT)
            if building is not None and building.done():
                self._building = None
                try:
                    self.timeline = building.result()
                except Exception:  # a store error: the old timeline stays, the next render retries
                    log.exception("reading the dashboard's timeline failed")
            if not self.timeline.built_at:
                return None
            last = await self.store.last_sequence()
            if last - self.timeline.cursor > CATCH_UP:
                self._rebuild(now, max(zoom.half, self.timeline.reach))
                return self.timeline
            query = EventQuery(cursor=self.timeline.cursor, limit=PAGE)
            while True:
                page = await self.store.events(query)
                _add_rows(self.timeline, page.rows)
                if page.next_cursor is None:
                    break
                query = replace(query, cursor=page.next_cursor)
            return self.timeline

    def _drawing(
        self,
        timeline: views.Timeline | None,
        shown: list[dict[str, Any]],
        filters: views.Filters,
        now: float,
    ) -> str:
        """The timeline's drawing: each notice while there are few, else the counts per
        zone and hour (for the whole fleet from the kept counts; for a search from the
        notices it finds)."""
        if timeline is None:
            return render.timeline_pending(filters)
        if timeline.dense and not (filters.zone or filters.text):
            return render.timeline_counts(timeline.counted(filters, now), now, filters)
        bars = timeline.select(shown, filters, now)
        # A zone's rows are instances, at most `render.MAX_TIMELINE_ROWS` of them, each with
        # a few notices: drawn one by one however crowded the zone.
        if filters.zone is not None or len(bars) <= views.DENSE:
            return render.timeline_svg(bars, now, filters)
        return render.timeline_counts(views.counted(bars), now, filters)

    async def _notices(self, where: NoticeFilter) -> list[dict[str, Any]]:
        """The store's notices with their current event decoded."""
        return self._decoded(await self.store.notices(where))

    async def index(self, request: web.Request) -> web.Response:
        """The fleet at a glance, at any size: counts from the store's tallies, one page of
        the notices in force (`?cursor=` pages on), the next week's scheduled ones, and the
        instances a search finds - never every instance or every notice. A timeline being
        read afresh meanwhile waits (`_idle`)."""
        with self._render():
            return await self._index(request)

    @contextlib.contextmanager
    def _render(self, pages: int = 1) -> Iterator[None]:
        """`pages` more renders under way for the block (-1: one fewer, while it waits for
        the rebuild itself)."""
        self._rendering += pages
        self._settle()
        try:
            yield
        finally:
            self._rendering -= pages
            self._settle()

    def _settle(self) -> None:
        if self._rendering > 0:
            self._quiet.clear()
        else:
            self._quiet.set()

    async def _index(self, request: web.Request) -> web.Response:
        now = time.time()
        try:
            filters = views.Filters.of(request.query)
        except views.BadZoom as exc:
            raise BadQuery(str(exc)) from None
        where = filters.notice_filter()
        page = await self.store.notice_page(
            where, cursor=request.query.get("cursor") or None, limit=views.PAGE_ROWS
        )
        shown = views.soonest_first(self._decoded(page.rows))
        soon: list[dict[str, Any]] = []
        if filters.status in (None, "scheduled"):
            ahead = await self.store.notice_page(
                replace(where, status="scheduled"),
                cursor=paging.encode([now, 0.0, "", ""]),  # from now on, by the index
                limit=views.PAGE_ROWS,
                starts=now + 7 * views.DAY,
            )
            soon = self._decoded(ahead.rows)
        day, week = views.coming(soon, now)
        groups = await self.store.notice_groups(where)
        counts = state.fleet_rows(
            await self.store.instance_counts(now), await self.store.retired_counts()
        )
        mine = [
            row
            for row in counts
            if filters.provider in (None, row[0]) and filters.zone in (None, row[2])
        ]
        found = None
        if filters.lists_instances:
            found = await self.store.instance_page(
                InstanceQuery(
                    provider=filters.provider,
                    zone=filters.zone,
                    search=filters.text,
                    cursor=request.query.get("icursor") or None,
                    limit=views.PAGE_ROWS,
                    now=now,
                    attestation=filters.attestation,
                    state=filters.state,
                )
            )
        attestation = await self.store.attestation_counts()
        head = replace(
            views.headline_of(mine, groups, soon, now, found.rows if found else None),
            attestation=attestation,
        )
        drawing = self._drawing(await self._timeline(now, filters.zoom), shown, filters, now)
        body = render.dashboard(head, shown, day, week, drawing, filters, now, groups, page.next)
        if found is not None:
            body += render.instances_found(found.rows, found.next, filters, now)
        body += render.fleet_tables(mine)
        body += render.versions_table(
            rollout.by_version(found.rows, now) if found else rollout.by_version_counts(mine)
        )
        options = self._options(groups, counts)
        if attestation["attested"] or attestation["unattested"] or filters.attestation:
            options["attestation"] = list(ATTESTATIONS)
        form = render.filters_form(filters, options)
        text = render.page("Maintenance fleet", body, now, await self._version(now), form)
        return web.Response(text=text, content_type=_HTML, headers={"Cache-Control": "no-store"})

    @staticmethod
    def _decoded(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Notices with their current event decoded: the store hands it over as received
        (`msgspec.Raw`, so the API writes it without re-encoding); the page reads it."""
        return [{**notice, "event": msgspec.json.decode(notice["event"])} for notice in rows]

    async def instance(self, request: web.Request) -> web.Response:
        """One VM's page: its row, its notices and its history (a timeline being read
        afresh meanwhile waits, as for `/`)."""
        with self._render():
            return await self._instance(request)

    async def _instance(self, request: web.Request) -> web.Response:
        now = time.time()
        name = request.match_info["name"]
        days = _days(request.query.get("days", "7"))
        rows = await self.store.instances([name])
        # Two VMs of one name (other projects, other clouds): the one heard from last.
        instance = max(rows, key=lambda row: row["last_seen"] or 0.0) if rows else None
        in_force: list[dict[str, Any]] = []
        eligibility = None
        history: list[dict[str, Any]] = []
        heartbeats = 0
        if instance is not None:
            in_force = await self._notices(NoticeFilter(instance=instance["source"]))
            known = {name: instance, instance["source"]: instance}
            answer = state.eligible(
                [name],
                known,
                {instance["source"]: [contract.from_cloudevent(n["event"]) for n in in_force]},
                now,
                self.horizon,
            )
            eligibility = answer["candidates"][0]
            page = await self.store.events(
                EventQuery(
                    instance=instance["source"], since=now - days * views.DAY, limit=MAX_EVENTS
                )
            )
            for _seq, ingest, _received, raw in page.rows:
                event = json.loads(raw)
                if event["type"] == contract.HEARTBEAT:
                    heartbeats += 1
                    continue
                history.append(_history_entry(event, ingest))
            history.sort(key=lambda entry: entry["time"])  # event time, not arrival order
        body = render.instance_page(
            instance, name, eligibility, in_force, history, heartbeats, days, now
        )
        text = render.page(f"{name}: maintenance fleet", body, now, await self._version(now))
        return web.Response(
            text=text,
            status=200 if instance is not None else 404,  # the page says why, in HTML
            content_type=_HTML,
            headers={"Cache-Control": "no-store"},
        )


def _add_rows(timeline: views.Timeline, rows: list[tuple[int, str, float, bytes]]) -> None:
    for seq, _ingest, _received, body in rows:
        timeline.add(seq, body)


def _seed(timeline: views.Timeline, notices: list[dict[str, Any]]) -> None:
    for notice in notices:
        timeline.seed({**notice, "event": msgspec.json.decode(notice["event"])})


def _days(text: str) -> float:
    """`?days=` of the instance page: how far back its history goes."""
    try:
        days = float(text)
    except ValueError:
        days = math.nan
    if not 0 < days <= MAX_DAYS:
        raise BadQuery(f"days: expected a number of days, more than 0 and at most {MAX_DAYS}")
    return days


def _history_entry(event: dict[str, Any], ingest: str) -> dict[str, Any]:
    """One row of an instance's history: when, what, which notice, and the detail."""
    data = event.get("data") or {}
    kind = event["type"]
    if kind in contract.MAINTENANCE_TYPES:
        detail = f"{data.get('kind')} {data.get('status')}"
        not_before = views.epoch(data.get("not_before"))
        if not_before is not None:
            detail += f", not before {render.readable(not_before)}"
        if data.get("description"):
            detail += f": {data['description']}"
    elif kind == contract.APPROVED:
        detail = f"approved by {data.get('approved_by')} ({data.get('rule')})"
    elif kind == contract.HOOK_COMPLETED:
        detail = f"hook {data.get('hook')}: {data.get('outcome')} (exit {data.get('exit_code')})"
    else:
        detail = ""
    short = kind.removeprefix("io.maintenancebridge.")
    return {
        "time": views.epoch(event.get("time")) or 0.0,
        "type": short,
        "notice_id": data.get("notice_id") or "",
        "detail": detail,
        "ingest": ingest,
    }
