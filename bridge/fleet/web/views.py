"""What the dashboard shows, as plain data built from the store's answers (no HTML here).

Kept apart from the rendering so the rules (what "soonest" means, which window a notice
draws, what a filter matches) read and test on their own. Every function takes `now`, so
one render is one consistent instant.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final
from urllib.parse import urlencode

import msgspec

from bridge import contract
from bridge.fleet.state import IN_FORCE, instance_state, zone_of

# The store's counts with the retired apart, shared with the API (`bridge.fleet.state`).
from bridge.fleet.state import FleetRow as FleetRow
from bridge.fleet.store import ATTESTATIONS, NoticeFilter
from bridge.infra.timeparse import parse_time

DAY: Final = 86400.0
#: An instance's states (`bridge.fleet.state.instance_state`), as `?state=` names them.
INSTANCE_STATES: Final = ("reporting", "silent", "retired")
#: A window without a known end is drawn this long (Azure Freeze is seconds, a reboot
#: minutes, a live migration under a minute; an hour keeps it visible on a 14-day axis).
DEFAULT_WINDOW: Final = 3600.0
#: The "Now" table shows at most this many rows; the headline still counts every notice.
MAX_ROWS: Final = 500
#: Rows of the page's "Now" table and of its instances found, per page (a keyset cursor,
#: `?cursor=`, pages on): a person reads a page, not 100,000 rows.
PAGE_ROWS: Final = 100


@dataclass(frozen=True, slots=True)
class Zoom:
    """How much of the timeline shows: `half` seconds before now and as many after, a grid
    line every `tick` seconds labelled in `unit`s (`+3h`, `+2d`)."""

    name: str
    half: float
    tick: float
    unit: str

    def label(self, offset: float) -> str:
        if offset == 0:
            return "now"
        step = 3600.0 if self.unit == "h" else DAY
        return f"{round(offset / step):+d}{self.unit}"

    @property
    def text(self) -> str:
        """`the last 24 hours and the next 24 hours`: the timeline's heading."""
        if self.half == DAY:
            return "last 24 hours and next 24 hours"
        return f"last {self.half / DAY:g} days and next {self.half / DAY:g} days"


#: The timeline's zooms (`?zoom=` of the page), the default first: a burst of notices
#: within an hour is one line at a week and separate windows at a day.
ZOOMS: Final = {
    zoom.name: zoom
    for zoom in (
        Zoom("week", 7 * DAY, DAY, "d"),
        Zoom("day", DAY, 3 * 3600.0, "h"),
        Zoom("month", 30 * DAY, 5 * DAY, "d"),
    )
}
DEFAULT_ZOOM: Final = "week"


class BadZoom(ValueError):
    """`?zoom=` names no zoom; the message lists the ones there are."""


def zoom_of(text: str | None) -> Zoom:
    """The zoom `?zoom=` names (absent or empty: a week); another value is refused."""
    name = (text or "").strip() or DEFAULT_ZOOM
    if name not in ZOOMS:
        raise BadZoom(f"zoom: expected one of {', '.join(ZOOMS)}, got {name[:40]!r}")
    return ZOOMS[name]


def epoch(text: str | None) -> float | None:
    """Unix seconds of an RFC 3339 time (None stays None)."""
    if not text:
        return None
    return parse_time(text).timestamp()


def start_of(notice: Mapping[str, Any]) -> float | None:
    """When a notice's maintenance begins: for one under way, when it was seen starting;
    else `not_before`, else its window's start (None when the provider gave no time)."""
    started = [t["time"] for t in notice.get("transitions", ()) if t["status"] == "started"]
    if notice.get("status") == "started" and started:
        return epoch(started[0])
    return epoch(notice.get("not_before") or (notice.get("window") or {}).get("start"))


@dataclass(frozen=True, slots=True)
class Filters:
    """The view's filters, all in the URL so a link shows the same view (None: any)."""

    provider: str | None = None
    zone: str | None = None
    kind: str | None = None
    text: str | None = None
    #: The timeline's zoom: not a filter, but kept in every link so a drill-down keeps it.
    zoom: Zoom = ZOOMS[DEFAULT_ZOOM]
    #: A notice status (scheduled, started).
    status: str | None = None
    #: Instances whose latest events were `attested`, `unattested` or `unchecked` (#34):
    #: lists those instances (the notices are not filtered by it).
    attestation: str | None = None
    #: Instances `reporting`, `silent` or `retired`: lists those instances (a page at a
    #: time; the notices are not filtered by it).
    state: str | None = None

    @classmethod
    def of(cls, query: Mapping[str, str]) -> Filters:
        """The filters of a URL query; a bad `zoom` or `status` raises `BadZoom`."""

        def value(key: str) -> str | None:
            return (query.get(key) or "").strip() or None

        status = value("status")
        if status is not None and status not in IN_FORCE:
            raise BadZoom(f"status: expected one of {', '.join(IN_FORCE)}, got {status[:40]!r}")
        attestation = value("attestation")
        if attestation is not None and attestation not in ATTESTATIONS:
            raise BadZoom(
                f"attestation: expected one of {', '.join(ATTESTATIONS)}, got {attestation[:40]!r}"
            )
        state = value("state")
        if state is not None and state not in INSTANCE_STATES:
            raise BadZoom(
                f"state: expected one of {', '.join(INSTANCE_STATES)}, got {state[:40]!r}"
            )
        return cls(
            value("provider"),
            value("zone"),
            value("kind"),
            value("q"),
            zoom_of(query.get("zoom")),
            status,
            attestation,
            state,
        )

    def notice_filter(self) -> NoticeFilter:
        """The store's filter of these (the text as a search of instance, notice, zone and
        source), so the store selects and pages instead of the page reading every notice."""
        return NoticeFilter(
            provider=self.provider,
            zone=self.zone,
            kind=self.kind,
            status=self.status,
            search=self.text,
        )

    def matches(self, notice: Mapping[str, Any]) -> bool:
        """Whether a notice (a `Store.notices` row) passes the filters."""
        if self.status is not None and notice.get("status") != self.status:
            return False
        return self.accepts(
            notice.get("provider"),
            notice.get("zone"),
            notice.get("kind"),
            (
                notice.get("instance"),
                notice.get("notice_id"),
                notice.get("zone"),
                notice.get("source"),
            ),
        )

    def accepts(
        self, provider: str | None, zone: str | None, kind: str | None, texts: Iterable[str | None]
    ) -> bool:
        """Provider, zone and kind exactly; the text anywhere in `texts` (the instance,
        notice, zone and source; case-insensitive)."""
        if self.provider is not None and provider != self.provider:
            return False
        if self.zone is not None and zone != self.zone:
            return False
        if self.kind is not None and kind != self.kind:
            return False
        if self.text is None:
            return True
        needle = self.text.lower()
        return any(needle in value.lower() for value in texts if value)

    def query(self, **change: Any) -> str:
        """The URL query of these filters with `change` applied ("" when none is set; the
        default zoom is left out)."""
        current = replace(self, **change)
        pairs = {
            "provider": current.provider,
            "zone": current.zone,
            "kind": current.kind,
            "status": current.status,
            "q": current.text,
            "attestation": current.attestation,
            "state": current.state,
            "zoom": None if current.zoom.name == DEFAULT_ZOOM else current.zoom.name,
        }
        text = urlencode({k: v for k, v in pairs.items() if v})
        return f"?{text}" if text else ""

    @property
    def active(self) -> bool:
        return any(
            (self.provider, self.zone, self.kind, self.status, self.text, self.attestation)
        ) or bool(self.state)

    @property
    def lists_instances(self) -> bool:
        """Whether the page lists instances (a search, an attestation or a state asked for)."""
        return bool(self.text or self.attestation or self.state)


@dataclass(frozen=True, slots=True)
class Headline:
    reporting: int
    silent: int
    by_status: dict[str, int]
    next_start: float | None
    next_instance: str | None
    #: Instances by attestation (#34), shown while any source checks identity.
    attestation: Mapping[str, int] | None = None
    #: Instances retention retired (not among the silent), shown when there are some.
    retired: int = 0


def headline_of(
    counts: Iterable[FleetRow],
    groups: Iterable[tuple[str, str, str, str, int]],
    soon: Iterable[Mapping[str, Any]],
    now: float,
    found: Iterable[Mapping[str, Any]] | None = None,
) -> Headline:
    """The headline from the store's counts: instances by state (`counts`, or the instances a
    search `found`), notices in force by status (`groups`), the next scheduled one of
    `soon` (soonest first)."""
    if found is not None:
        states: Counter[str] = Counter(instance_state(row, now)[0] for row in found)
        reporting, silent, retired = states["reporting"], states["silent"], states["retired"]
    else:
        rows = list(counts)
        silent = sum(row[4] for row in rows)
        retired = sum(row[5] for row in rows)
        reporting = sum(row[3] for row in rows) - silent - retired
    by_status: Counter[str] = Counter({"scheduled": 0, "started": 0})
    for _provider, _zone, _kind, status, count in groups:
        by_status[status] += count
    first = next(
        (
            (start, notice["instance"])
            for notice in soon
            if (start := start_of(notice)) is not None and start >= now
        ),
        None,
    )
    return Headline(
        reporting,
        silent,
        dict(by_status),
        first[0] if first else None,
        first[1] if first else None,
        retired=retired,
    )


def cells_of(
    groups: Iterable[tuple[str, str, str, str, int]],
) -> tuple[list[str], list[str], Counter[Any]]:
    """Zones, kinds and (zone, kind) counts of the store's notice groups (`where` of the
    notices themselves, without reading them)."""
    cells: Counter[tuple[str, str]] = Counter()
    for _provider, zone, kind, _status, count in groups:
        cells[(zone or "none", kind)] += count
    zones = sorted({zone for zone, _ in cells})
    kinds = sorted({kind for _, kind in cells})
    return zones, kinds, cells


def soonest_first(notices: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Started notices first (they are happening), then by start; unknown starts last."""

    def key(notice: dict[str, Any]) -> tuple[int, float]:
        start = start_of(notice)
        if notice["status"] == "started":
            return (0, start or 0.0)
        return (1, start) if start is not None else (2, 0.0)

    return sorted(notices, key=key)


def coming(
    notices: Iterable[dict[str, Any]], now: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Scheduled notices starting within 24 h, and between 24 h and 7 days, soonest first."""
    day, week = [], []
    for notice in soonest_first(n for n in notices if n["status"] == "scheduled"):
        start = start_of(notice)
        if start is None or start < now:
            continue
        if start <= now + DAY:
            day.append(notice)
        elif start <= now + 7 * DAY:
            week.append(notice)
    return day, week


def sidecar_actions(notice: Mapping[str, Any]) -> list[str]:
    """What the VM's sidecar did about a notice: approvals and hook runs, in order."""
    done = []
    for approval in notice.get("approvals", ()):
        done.append(f"approved ({approval.get('rule', '?')})")
    for hook in notice.get("hooks", ()):
        done.append(f"{hook.get('hook', 'hook')}: {hook.get('outcome', '?')}")
    return done


@dataclass(slots=True)
class Bar:
    """One notice on the timeline: its window and the marks of what happened."""

    instance: str
    notice_id: str
    source: str
    provider: str
    zone: str
    kind: str
    status: str
    start: float
    end: float
    started: list[float]
    completed: list[float]
    #: What a text filter searches, lower case: instance, notice, zone and source.
    haystack: str = ""

    def __post_init__(self) -> None:
        if not self.haystack:
            self.haystack = f"{self.instance}\n{self.notice_id}\n{self.zone}\n{self.source}".lower()

    def copy(self) -> Bar:
        return replace(self, started=list(self.started), completed=list(self.completed))

    def window(self, data: Mapping[str, Any]) -> None:
        """Take the announced window of a scheduled event (or a notice in force)."""
        window = data.get("window") or {}
        start = epoch(data.get("not_before") or window.get("start"))
        if start is not None:
            self.start = start
        end = epoch(window.get("end"))
        length = data.get("duration_seconds") or DEFAULT_WINDOW
        self.end = max(self.end, end if end is not None else self.start + float(length))


class _Event(msgspec.Struct):
    type: str
    source: str
    time: str
    data: msgspec.Raw


_EVENT: Final = msgspec.json.Decoder(_Event)
_DATA: Final = msgspec.json.Decoder(dict[str, Any])


#: Above this many notices on the timeline it is drawn as counts per row and time bucket
#: (`Density`), not one shape per notice: 30,000 notices are 30,000 shapes to compute and
#: send, and a person reads the crowd, not the shapes.
DENSE: Final = 2_000
#: The counted timeline's time bucket, seconds (aligned to the epoch, so a count never
#: moves between buckets as time passes): an hour is 3 pixels of a week's zoom.
BUCKET: Final = 3600.0
#: What a bucket counts: windows opening in it, and the notices seen starting and completing.
WHATS: Final = ("window", "started", "completed")
_Cell = tuple[str, str, str, str, str, int]  # provider, zone, kind, status, what, bucket


@dataclass(frozen=True, slots=True)
class Count:
    """Notices of one row of the counted timeline: `n` of `kind` in `status` whose `what`
    (a window opening, a start, a completion) falls in time bucket `bucket`."""

    row: str
    what: str
    kind: str
    status: str
    bucket: int
    n: int


def _cells(bar: Bar) -> Iterator[_Cell]:
    """The counted timeline's cells one notice adds to: its window's opening and its marks."""
    head = (bar.provider, bar.zone, bar.kind, bar.status)
    yield (*head, "window", int(bar.start // BUCKET))
    for mark in bar.started:
        yield (*head, "started", int(mark // BUCKET))
    for mark in bar.completed:
        yield (*head, "completed", int(mark // BUCKET))


class Timeline:
    """The bars of the maintenance events of the last `reach` seconds, kept between renders,
    and their counts per (provider, zone, kind, status, time bucket), kept as the bars change.

    Every render would otherwise decode a week of the audit log (80,000 maintenance events
    at 100,000 VMs: seconds); this keeps the bars and reads only the events after `cursor`
    (the audit log's sequence). A dense timeline is drawn from the counts (`counted`), which
    are as many as rows times buckets however many notices there are. `stale` says when to
    build it again from the store (every `REBUILD_AFTER` seconds, or when a zoom reaches
    further back than it read): old bars are dropped then, and a store whose sequence commits
    out of order (PostgreSQL under concurrent writers) cannot hide an event for longer. It
    reads a week until a month's zoom is asked for, and a month from then on.
    """

    REBUILD_AFTER: Final = 3600.0

    def __init__(self, built_at: float = 0.0, reach: float = 7 * DAY) -> None:
        self.bars: dict[tuple[str, str], Bar] = {}
        #: The bars' keys by zone (a bar's zone never changes): a zone's drill-down reads
        #: its own bars, not the fleet's.
        self.zones: dict[str, list[tuple[str, str]]] = {}
        self.cells: Counter[_Cell] = Counter()
        #: Whether `cells` follows each change (off while a build adds its bars).
        self.counting = True
        self.cursor = 0
        self.built_at = built_at
        self.reach = reach

    def stale(self, now: float, reach: float = 7 * DAY) -> bool:
        return now - self.built_at > self.REBUILD_AFTER or reach > self.reach

    @property
    def dense(self) -> bool:
        return len(self.bars) > DENSE

    def count(self, bars: Iterable[Bar]) -> None:
        """Count `bars` into the cells: a build adds its bars with `counting` off, counts
        them a slice at a time with this, then turns `counting` on."""
        for bar in bars:
            for cell in _cells(bar):
                self.cells[cell] += 1

    def _count(self, bar: Bar, delta: int) -> None:
        if not self.counting:
            return
        for cell in _cells(bar):
            self.cells[cell] += delta
            if not self.cells[cell]:
                del self.cells[cell]

    def add(self, seq: int, body: bytes) -> None:
        """One audit-log row; only maintenance transitions draw something."""
        self.cursor = max(self.cursor, seq)
        event = _EVENT.decode(body)
        if event.type not in contract.MAINTENANCE_TYPES:
            return
        data = _DATA.decode(event.data)
        at = epoch(event.time) or 0.0
        found = self._bar(event.source, data, at)
        self._count(found, -1)
        found.status = str(data.get("status"))
        if event.type == contract.SCHEDULED:
            found.window(data)
        elif event.type == contract.STARTED:
            if at not in found.started:  # an event read twice (a rebuild's overlap) counts once
                found.started.append(at)
            found.start = min(found.start, at)
            found.end = max(found.end, at + float(data.get("duration_seconds") or 0))
        else:
            if at not in found.completed:
                found.completed.append(at)
            found.end = max(found.end, at)
        self._count(found, 1)

    def seed(self, notice: Mapping[str, Any]) -> None:
        """A notice in force as the store holds it (its event decoded): its current status
        and window, so that one announced before the reach is drawn too."""
        data = notice["event"]["data"]
        found = self._bar(notice["source"], data, epoch(notice.get("updated")) or 0.0)
        self._count(found, -1)
        found.status = str(notice["status"])
        found.window(data)
        self._count(found, 1)

    def _bar(self, source: str, data: Mapping[str, Any], at: float) -> Bar:
        key = (source, str(data.get("notice_id")))
        found = self.bars.get(key)
        if found is None:
            found = self.bars[key] = _new_bar(source, data, at)
            self.zones.setdefault(found.zone, []).append(key)
            self._count(found, 1)  # as every change takes its old cells off first
        return found

    def select(
        self, in_force: Iterable[Mapping[str, Any]], filters: Filters, now: float
    ) -> list[Bar]:
        """The bars that pass `filters` and touch the zoom's span around `now`, with the
        notices in force's current windows (copies: the kept bars stay as the log says)."""
        left, right = now - filters.zoom.half, now + filters.zoom.half
        needle = filters.text.lower() if filters.text else None
        chosen: dict[tuple[str, str], Bar] = {}
        keys = self.bars if filters.zone is None else self.zones.get(filters.zone, ())
        for key in keys:
            bar = self.bars[key]
            if (
                bar.end >= left
                and bar.start <= right
                and (filters.zone is None or bar.zone == filters.zone)
                and (filters.status is None or bar.status == filters.status)
                and (filters.provider is None or bar.provider == filters.provider)
                and (filters.kind is None or bar.kind == filters.kind)
                and (needle is None or needle in bar.haystack)
            ):
                chosen[key] = bar
        for notice in in_force:
            if not filters.matches(notice):
                continue
            key = (notice["source"], notice["notice_id"])
            kept = chosen.get(key) or self.bars.get(key)
            updated = epoch(notice.get("updated")) or now
            bar = (
                kept.copy()
                if kept
                else _new_bar(notice["source"], notice["event"]["data"], updated)
            )
            bar.status = notice["status"]
            bar.window(notice["event"]["data"])
            chosen[key] = bar
        return list(chosen.values())  # the drawing orders its rows

    def counted(self, filters: Filters, now: float) -> list[Count]:
        """The counts per zone and bucket in the zoom's span that pass the provider, kind
        and status filters (a zone or a text narrows to bars: `select`)."""
        left, right = (now - filters.zoom.half) // BUCKET, (now + filters.zoom.half) // BUCKET
        return [
            Count(zone, what, kind, status, bucket, n)
            for (provider, zone, kind, status, what, bucket), n in self.cells.items()
            if left <= bucket <= right
            and (filters.provider is None or provider == filters.provider)
            and (filters.kind is None or kind == filters.kind)
            and (filters.status is None or status == filters.status)
        ]


def counted(bars: Iterable[Bar]) -> list[Count]:
    """Counts of `bars` (already chosen: a search's) per zone and bucket, drawn as the
    whole fleet's are."""
    cells: Counter[tuple[str, str, str, str, int]] = Counter()
    for bar in bars:
        for _provider, zone, kind, status, what, bucket in _cells(bar):
            cells[(zone, what, kind, status, bucket)] += 1
    return [Count(*cell, n) for cell, n in cells.items()]


def _new_bar(source: str, data: Mapping[str, Any], at: float) -> Bar:
    """A bar for a notice first seen at `at`, from a maintenance event's data."""
    instance = data.get("instance") or {}
    return Bar(
        instance=str(instance.get("name") or "?"),
        notice_id=str(data.get("notice_id")),
        source=source,
        provider=str(data.get("provider")),
        zone=zone_of(instance.get("zone"), instance.get("location")) or "none",
        kind=str(data.get("kind")),
        status=str(data.get("status")),
        start=at,
        end=at,
        started=[],
        completed=[],
    )
