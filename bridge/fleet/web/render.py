"""The dashboard's HTML, written server-side so every table reads without JavaScript.

Plain functions over `bridge.fleet.web.views` data that return escaped HTML strings, and
one page template (`templates/page.html`, `string.Template`): no template engine to
install, nothing to build. Every value from the store goes through `escape`; the only
markup is written here. Times carry a machine-readable `datetime` for the live countdown
(`static/dashboard.js`) and a readable text for the page without it.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from functools import cache
from importlib.resources import files
from string import Template
from typing import Any, Final
from urllib.parse import quote, urlencode

from bridge.fleet import rollout
from bridge.fleet.state import IN_FORCE, SILENT_AFTER_INTERVALS, instance_state
from bridge.fleet.web import views
from bridge.fleet.web.views import Bar, Filters, Headline

#: The drawing's width in pixels (the row names are beside it, in HTML); it scrolls sideways
#: in its box on a screen narrower than this.
PLOT_WIDTH: Final = 960
#: A row's height in pixels: the names' list items (dashboard.css) are as high.
ROW_HEIGHT: Final = 22
END: Final = ' text-anchor="end"'
#: A zone's drill-down draws at most this many instances.
MAX_TIMELINE_ROWS: Final = 200
#: Rows of the instances-by-zone table, at most (those with silent instances first).
MAX_ZONE_ROWS: Final = 100


def escape(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


@cache
def _template() -> Template:
    text = files("bridge.fleet.web").joinpath("templates/page.html").read_text("utf-8")
    return Template(text)


def iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def readable(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%d %H:%M UTC")


def relative(seconds: float) -> str:
    """`in 1h 05m`, `3m 12s ago`: what the countdown shows, also without JavaScript."""
    span = abs(int(seconds))
    days, rest = divmod(span, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        text = f"{days}d {hours:02d}h"
    elif hours:
        text = f"{hours}h {minutes:02d}m"
    elif minutes:
        text = f"{minutes}m {secs:02d}s"
    else:
        text = f"{secs}s"
    return f"in {text}" if seconds >= 0 else f"{text} ago"


def countdown(moment: float | None, now: float) -> str:
    if moment is None:
        return '<span class="muted">time unknown</span>'
    return (
        f'<time datetime="{iso(moment)}" data-countdown title="{readable(moment)}">'
        f"{relative(moment - now)}</time>"
    )


def instance_link(name: str | None) -> str:
    if not name:
        return '<span class="muted">?</span>'
    return f'<a href="/instances/{quote(name, safe="")}">{escape(name)}</a>'


def page(title: str, body: str, now: float, version: str, filters: str = "") -> str:
    return _template().substitute(
        title=escape(title),
        body=body,
        filters=filters,
        rendered_iso=iso(now),
        rendered=readable(now),
        version=escape(version),
        version_url="/dashboard/version",
    )


# -- the dashboard ----------------------------------------------------------------------------


def filters_form(filters: Filters, options: Mapping[str, Sequence[str]]) -> str:
    """A GET form: the filters live in the URL, so a link or a reload shows the same view."""

    def select(name: str, label: str, current: str | None) -> str:
        choices = [f'<option value="">any {escape(label.lower())}</option>']
        for value in options.get(name, ()):
            chosen = " selected" if value == current else ""
            choices.append(f'<option value="{escape(value)}"{chosen}>{escape(value)}</option>')
        return (
            f'<label for="f-{name}">{escape(label)}</label>'
            f'<select id="f-{name}" name="{name}">{"".join(choices)}</select>'
        )

    clear = '<a href="/" class="clear">clear</a>' if filters.active else ""
    # Offered while a source checks identity (the routes add the choices then).
    identity = (
        select("attestation", "Identity", filters.attestation) if "attestation" in options else ""
    )
    state = select("state", "Instances", filters.state) if "state" in options else ""
    zoom = ""  # the form's GET replaces the query: the zoom rides along
    if filters.zoom.name != views.DEFAULT_ZOOM:
        zoom = f'<input type="hidden" name="zoom" value="{escape(filters.zoom.name)}">'
    return (
        '<form class="filters" method="get" action="/" role="search" aria-label="Filters">'
        f"{select('provider', 'Provider', filters.provider)}"
        f"{select('zone', 'Zone', filters.zone)}"
        f"{select('kind', 'Kind', filters.kind)}"
        f"{select('status', 'Status', filters.status)}"
        f"{state}{identity}"
        '<label for="f-q">Text</label>'
        f'<input id="f-q" name="q" type="search" value="{escape(filters.text)}" '
        'placeholder="instance, notice, zone">'
        f"{zoom}"
        f'<button type="submit">Filter</button>{clear}</form>'
    )


def headline(head: Headline, now: float) -> str:
    scheduled, started = head.by_status.get("scheduled", 0), head.by_status.get("started", 0)
    silent = ' class="alert"' if head.silent else ""
    if head.next_start is None:
        following = '<span class="muted">none scheduled</span>'
    else:
        following = f"{countdown(head.next_start, now)} on {instance_link(head.next_instance)}"
    return (
        '<section aria-labelledby="h-headline"><h1 id="h-headline">Fleet at a glance</h1>'
        '<dl class="headline">'
        f'<div><dt>Instances reporting</dt><dd id="reporting">{head.reporting}</dd></div>'
        f'<div{silent}><dt>Silent</dt><dd id="silent">{head.silent}</dd></div>'
        f'<div><dt>Started</dt><dd id="started">{started}</dd></div>'
        f'<div><dt>Scheduled</dt><dd id="scheduled">{scheduled}</dd></div>'
        f"{_retired_count(head.retired)}"
        f'<div class="next"><dt>Next maintenance</dt><dd id="next">{following}</dd></div>'
        f"{_attestation_counts(head.attestation)}</dl></section>"
    )


def _retired_count(retired: int) -> str:
    """Instances retention retired (not heard from for `retire_after_days`): apart from the
    silent ones, a link to their list; nothing while there are none."""
    if not retired:
        return ""
    href = escape("/?" + urlencode({"state": "retired"}))
    return f'<div><dt>Retired</dt><dd id="retired"><a href="{href}">{retired}</a></dd></div>'


def _attestation_counts(counts: Mapping[str, int] | None) -> str:
    """Attested and unattested instances (#34), each a link to the list of them; nothing
    while no source checks identity."""
    if not counts or not (counts.get("attested") or counts.get("unattested")):
        return ""
    cells = []
    for state in ("attested", "unattested"):
        n = counts.get(state, 0)
        alert = ' class="alert"' if state == "unattested" and n else ""
        href = escape("/?" + urlencode({"attestation": state}))
        cells.append(
            f'<div{alert}><dt>{state.capitalize()}</dt><dd id="{state}">'
            f'<a href="{href}">{n}</a></dd></div>'
        )
    return "".join(cells)


def attestation_badge(state: str | None) -> str:
    """An instance's `attestation` as the page shows it: attested, unattested, or a dash
    when its source checks no identity."""
    if state in ("attested", "unattested"):
        return f'<span class="badge {state}">{state}</span>'
    return '<span class="muted" title="identity not checked">—</span>'


def notices_table(
    table_id: str,
    caption: str,
    notices: Sequence[dict[str, Any]],
    now: float,
    total: int | None = None,
) -> str:
    """A table of notices; `total` is how many there are in all when this is one page."""
    if not notices:
        return f'<p class="empty" id="{table_id}-empty">{escape(caption)}: none.</p>'
    rows = []
    for notice in notices[: views.MAX_ROWS]:
        data = notice["event"]["data"]
        done = views.sidecar_actions(notice)
        kind = escape(notice["kind"])
        rows.append(
            f'<tr class="s-{escape(notice["status"])}" data-notice="{escape(notice["notice_id"])}">'
            f'<td data-label="Starts">{countdown(views.start_of(notice), now)}</td>'
            f'<td data-label="Status"><span class="status">{escape(notice["status"])}</span></td>'
            f'<td data-label="Kind"><span class="kind k-{kind}">{kind}</span></td>'
            f'<td data-label="Provider">{escape(notice["provider"])}</td>'
            f'<td data-label="Zone" class="zone">{escape(notice.get("zone") or "")}</td>'
            f'<th scope="row" data-label="Instance">{instance_link(notice["instance"])}</th>'
            f'<td data-label="Origin">{escape(data.get("origin") or "")}</td>'
            f'<td data-label="Sidecar did">'
            f"{escape('; '.join(done)) if done else '<span class=muted>-</span>'}</td>"
            "</tr>"
        )
    more = ""
    if len(notices) > views.MAX_ROWS:
        more = (
            f'<p class="more">{len(notices) - views.MAX_ROWS} more not shown: narrow the '
            "filters.</p>"
        )
    return (
        f'<div class="scroll"><table id="{table_id}" class="cards"><caption>{escape(caption)} '
        f"({len(notices) if total is None else total})</caption><thead><tr>"
        '<th scope="col">Starts</th><th scope="col">Status</th><th scope="col">Kind</th>'
        '<th scope="col">Provider</th><th scope="col">Zone</th><th scope="col">Instance</th>'
        '<th scope="col">Origin</th><th scope="col">Sidecar did</th>'
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div>{more}"
    )


def where_table(groups: Iterable[tuple[str, str, str, str, int]], filters: Filters) -> str:
    zones, kinds, cells = views.cells_of(groups)
    if not zones:
        return '<p class="empty">No notice in force.</p>'
    head = "".join(f'<th scope="col">{escape(kind)}</th>' for kind in kinds)
    rows = []
    for zone in zones:
        cells_html = "".join(f"<td>{cells[(zone, kind)] or ''}</td>" for kind in kinds)
        total = sum(cells[(zone, kind)] for kind in kinds)
        link = f'<a href="/{filters.query(zone=zone)}">{escape(zone)}</a>'
        rows.append(f'<tr><th scope="row">{link}</th>{cells_html}<td>{total}</td></tr>')
    return (
        '<div class="scroll"><table id="where"><caption>Notices in force by zone and kind'
        f'</caption><thead><tr><th scope="col">Zone</th>{head}<th scope="col">Total</th>'
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def zoom_links(filters: Filters) -> str:
    """Day, week, month: links that keep the filters (the zoom lives in the URL too)."""
    links = []
    for zoom in views.ZOOMS.values():
        if zoom == filters.zoom:
            links.append(f'<strong aria-current="true">{zoom.name}</strong>')
        else:
            href = f"/{filters.query(zoom=zoom)}"
            links.append(f'<a href="{escape(href)}" data-zoom="{zoom.name}">{zoom.name}</a>')
    return f'<nav class="zoom" aria-label="Timeline zoom">Zoom: {" · ".join(links)}</nav>'


def timeline_svg(bars: Sequence[Bar], now: float, filters: Filters) -> str:
    """The zoom's span before and after now: a row per zone (per instance once a zone is
    chosen), windows as bars, started as triangles, completed as dots; `now` is the middle
    line. The row names are HTML beside the drawing, not in it: on a narrow screen the
    drawing scrolls sideways (the script brings `now` into view) while the names stay."""
    zoom = filters.zoom
    left, right = now - zoom.half, now + zoom.half
    rows: dict[str, list[Bar]] = {}
    for item in bars:
        if item.end >= left and item.start <= right:
            rows.setdefault(item.instance if filters.zone else item.zone, []).append(item)

    def busy(row: str) -> bool:
        return any(b.status in IN_FORCE for b in rows[row])

    return _timeline(rows, busy, _row_shapes, now, filters)


def timeline_counts(counts: Sequence[views.Count], now: float, filters: Filters) -> str:
    """A dense timeline (more than `views.DENSE` notices): per row and time bucket, how many
    windows open, how many notices started and completed there, as shaded cells whose
    darkness grows with the count (the count in each one's tooltip) - a crowd of 30,000
    notices in a few hundred shapes."""
    rows: dict[str, list[views.Count]] = {}
    for count in counts:
        rows.setdefault(count.row, []).append(count)
    most = max((count.n for count in counts), default=1)
    width = max(3, round(views.BUCKET * PLOT_WIDTH / (2 * filters.zoom.half)))

    def busy(row: str) -> bool:
        return any(c.status in IN_FORCE for c in rows[row])

    def shapes(items: Sequence[views.Count], top: int, x: Callable[[float], float]) -> list[str]:
        return _count_shapes(items, top, x, most, width)

    drawn = _timeline(rows, busy, shapes, now, filters)
    if not rows:
        return drawn
    return (
        f'<p class="legend" id="timeline-counted">{sum(c.n for c in counts if c.what == "window")}'
        " notices, counted per hour: the darker a cell, the more notices (up to "
        f"{most} in one); its tooltip says how many. Narrow the filters to see each one.</p>"
        + drawn
    )


def timeline_pending(filters: Filters) -> str:
    """While the timeline is first read from the audit log (seconds at 100,000 VMs): the
    rest of the page does not wait for it, and the live update brings it in."""
    return (
        f'<p class="empty" id="timeline-pending">The timeline of the {escape(filters.zoom.text)} '
        "is being read from the audit log; it shows on the next update.</p>"
    )


def _timeline(
    rows: Mapping[str, Sequence[Any]],
    busy: Callable[[str], bool],
    shapes: Callable[[Sequence[Any], int, Callable[[float], float]], list[str]],
    now: float,
    filters: Filters,
) -> str:
    """The drawing's frame: the grid, the `now` line, the row names beside it (at most
    `MAX_TIMELINE_ROWS`, those with a notice in force first), and each row's `shapes`."""
    zoom = filters.zoom
    left, right = now - zoom.half, now + zoom.half
    scale = PLOT_WIDTH / (right - left)

    def x(moment: float) -> float:
        return (min(max(moment, left), right) - left) * scale

    if not rows:
        return f'<p class="empty">Nothing in the {escape(zoom.text)}.</p>'
    hidden = max(0, len(rows) - MAX_TIMELINE_ROWS)
    if hidden:  # rows with a notice in force first, then by name
        ranked = sorted(rows, key=lambda row: (not busy(row), row))
        rows = {row: rows[row] for row in ranked[:MAX_TIMELINE_ROWS]}
    height = ROW_HEIGHT * (len(rows) + 1)
    labels = []
    parts = [
        f'<svg id="timeline-svg" width="{PLOT_WIDTH}" height="{height}" '
        f'viewBox="0 0 {PLOT_WIDTH} {height}" role="img" aria-labelledby="h-timeline" '
        f'data-now-x="{x(now):.0f}">'
    ]
    ticks = int(zoom.half // zoom.tick)
    for step in range(-ticks, ticks + 1):
        offset = step * zoom.tick
        at = x(now + offset)
        anchor = END if step == ticks else ""
        parts.append(
            f'<line class="{"now" if step == 0 else "grid"}" x1="{at:.1f}" x2="{at:.1f}" '
            f'y1="0" y2="{height}"/><text class="tick" x="{at - 2 if anchor else at + 2:.1f}" '
            f'y="{height - 6}"{anchor}>{zoom.label(offset)}</text>'
        )
    for index, (row, items) in enumerate(sorted(rows.items())):
        top = index * ROW_HEIGHT
        link = f"/{filters.query(zone=row)}" if not filters.zone else f"/instances/{quote(row)}"
        labels.append(
            f'<li><a class="row" href="{escape(link)}" title="{escape(row)}">{escape(row)}</a></li>'
        )
        parts.extend(shapes(items, top, x))
    parts.append("</svg>")
    labels.append('<li aria-hidden="true"></li>')  # beside the time axis
    drawn = (
        f'<div class="timeline"><ol class="tl-labels">{"".join(labels)}</ol>'
        f'<div class="tl-plot" id="timeline-plot">{"".join(parts)}</div></div>'
    )
    if hidden:
        drawn += (
            f'<p class="more">{hidden} more rows not drawn (those with a notice in force come '
            "first): narrow the filters.</p>"
        )
    return drawn


def _count_shapes(
    items: Sequence[views.Count], top: int, x: Callable[[float], float], most: int, width: int
) -> list[str]:
    """One row of the counted timeline: per bucket, a cell for the windows opening (by kind
    and status), a triangle for the starts and a dot for the completions, each shaded by
    its count against the busiest cell (`most`)."""
    merged: dict[tuple[str, int, str, str], list[int]] = {}
    for count in items:
        at = round(x(count.bucket * views.BUCKET))
        kind, status = (count.kind, count.status) if count.what == "window" else ("", "")
        cell = merged.setdefault((count.what, at, kind, status), [0, count.bucket])
        cell[0] += count.n
        cell[1] = min(cell[1], count.bucket)
    shapes = []
    for (what, at, kind, status), (n, bucket) in sorted(merged.items()):
        shade = f' fill-opacity="{0.25 + 0.75 * n / most:.2f}"'
        hour = readable(bucket * views.BUCKET)
        if what == "window":
            shapes.append(
                f'<rect class="win k-{escape(kind)} s-{escape(status)}" x="{at}" y="{top + 5}" '
                f'width="{width}" height="{ROW_HEIGHT - 10}"{shade}>'
                f"<title>{n} {escape(kind)} {escape(status)}: windows from {hour}</title></rect>"
            )
        elif what == "started":
            shapes.append(
                f'<path class="mark-started" d="M{at} {top + 2}l5 9h-10z"{shade}>'
                f"<title>{n} started from {hour}</title></path>"
            )
        else:
            shapes.append(
                f'<circle class="mark-completed" cx="{at}" cy="{top + ROW_HEIGHT - 5}" r="3.5"'
                f"{shade}><title>{n} completed from {hour}</title></circle>"
            )
    return shapes


def _row_shapes(items: Sequence[Bar], top: int, x: Callable[[float], float]) -> list[str]:
    """One row's windows and marks. Shapes that would land on the same pixels are drawn
    once with their count in the tooltip, so a zone of thousands of VMs stays a few hundred
    shapes (the page stays small and fast at 10,000 instances)."""
    windows: dict[tuple[int, int, str, str], list[Bar]] = {}
    started: dict[int, list[float]] = {}
    completed: dict[int, list[float]] = {}
    for item in items:
        start = round(x(item.start))
        key = (start, max(round(x(item.end)), start + 3), item.kind, item.status)
        windows.setdefault(key, []).append(item)
        for mark in item.started:
            started.setdefault(round(x(mark)), []).append(mark)
        for mark in item.completed:
            completed.setdefault(round(x(mark)), []).append(mark)
    shapes = []
    for (start, end, kind, status), same in windows.items():
        first = same[0]
        tip = (
            f"{first.instance}: {kind} {status} ({first.notice_id}) "
            f"{readable(first.start)} - {readable(first.end)}"
        )
        if len(same) > 1:
            tip = f"{len(same)} notices, {kind} {status}, e.g. {tip}"
        shapes.append(
            f'<rect class="win k-{escape(kind)} s-{escape(status)}" x="{start}" y="{top + 5}" '
            f'width="{end - start}" height="{ROW_HEIGHT - 10}"><title>{escape(tip)}</title></rect>'
        )
    for at, marks in started.items():
        count = f"{len(marks)} x " if len(marks) > 1 else ""
        shapes.append(
            f'<path class="mark-started" d="M{at} {top + 2}l5 9h-10z">'
            f"<title>{count}started {escape(readable(marks[0]))}</title></path>"
        )
    for at, marks in completed.items():
        count = f"{len(marks)} x " if len(marks) > 1 else ""
        shapes.append(
            f'<circle class="mark-completed" cx="{at}" cy="{top + ROW_HEIGHT - 5}" r="3.5">'
            f"<title>{count}completed {escape(readable(marks[0]))}</title></circle>"
        )
    return shapes


def pager(filters: Filters, key: str, cursor: str | None) -> str:
    """The link to the next page of a list (`key` is its cursor's name in the URL)."""
    if cursor is None:
        return ""
    query = filters.query()
    href = f"/{query}{'&' if query else '?'}{urlencode({key: cursor})}"
    return f'<p class="more"><a rel="next" id="{key}-next" href="{escape(href)}">Next page</a></p>'


def dashboard(
    head: Headline,
    in_force: Sequence[dict[str, Any]],
    day: Sequence[dict[str, Any]],
    week: Sequence[dict[str, Any]],
    timeline: str,
    filters: Filters,
    now: float,
    groups: Sequence[tuple[str, str, str, str, int]],
    following: str | None = None,
) -> str:
    """The page's sections; `in_force` is one page of the notices in force (`following`:
    the next page's cursor), `groups` the store's counts of all of them, `timeline` the
    drawing (`timeline_svg`, `timeline_counts` or `timeline_pending`)."""
    row_unit = "instance" if filters.zone else "zone"
    total = sum(group[4] for group in groups)
    return "".join(
        [
            headline(head, now),
            '<section aria-labelledby="h-now"><h2 id="h-now">Now: notices in force</h2>',
            notices_table("now", "Notices in force, soonest first", in_force, now, total),
            pager(filters, "cursor", following),
            "</section>",
            '<section aria-labelledby="h-coming"><h2 id="h-coming">Coming</h2>',
            notices_table("coming-24h", "Scheduled within 24 h", day, now),
            notices_table("coming-7d", "Scheduled in 24 h to 7 days", week, now),
            "</section>",
            f'<section aria-labelledby="h-timeline"><h2 id="h-timeline">Timeline: '
            f"{filters.zoom.text}, per {row_unit}</h2>",
            zoom_links(filters),
            timeline,
            '<p class="legend"><span class="win-key"></span> window '
            "<span>▲</span> started <span>●</span> completed</p>",
            "</section>",
            '<section aria-labelledby="h-where"><h2 id="h-where">Where</h2>',
            where_table(groups, filters),
            "</section>",
        ]
    )


def instances_found(
    rows: Sequence[Mapping[str, Any]], following: str | None, filters: Filters, now: float
) -> str:
    """The instances whose name holds the search text (or whose source it is) and whose
    attestation is the one asked for, a page."""
    wanted = " and ".join(
        part
        for part in (
            f"matching {escape(filters.text)}" if filters.text else "",
            escape(filters.attestation) if filters.attestation else "",
            escape(filters.state) if filters.state else "",
        )
        if part
    )
    if not rows:
        return (
            '<section aria-labelledby="h-found"><h2 id="h-found">Instances found</h2>'
            f'<p class="empty" id="found-empty">No instance {wanted}.</p></section>'
        )
    body = "".join(
        f'<tr><th scope="row">{instance_link(row["name"])}</th>'
        f"<td>{escape(row['provider'])}</td><td>{escape(row.get('zone') or '')}</td>"
        f"<td>{instance_state(row, now)[0]}</td>"
        f"<td>{escape(row.get('agent_version') or rollout.UNKNOWN)}</td>"
        f"<td>{attestation_badge(row.get('attestation'))}</td>"
        f"<td>{len(row.get('notices') or ())}</td></tr>"
        for row in rows
    )
    return (
        '<section aria-labelledby="h-found"><h2 id="h-found">Instances found</h2>'
        f'<div class="scroll"><table id="found"><caption>Instances {wanted}'
        '</caption><thead><tr><th scope="col">Instance</th>'
        '<th scope="col">Provider</th><th scope="col">Zone</th><th scope="col">State</th>'
        '<th scope="col">Version</th><th scope="col">Identity</th>'
        '<th scope="col">Notices in force</th></tr></thead>'
        f"<tbody>{body}</tbody></table></div>{pager(filters, 'icursor', following)}</section>"
    )


def fleet_tables(counts: Sequence[views.FleetRow]) -> str:
    """Instances by provider and by zone (reporting, silent, retired when there are some,
    total), from the store's counts: the shape of a fleet of any size in two small tables.
    Zones with silent instances first; at most `MAX_ZONE_ROWS` of them."""
    if not counts:
        return ""
    providers: dict[str, list[int]] = {}
    zones: dict[str, list[int]] = {}
    for provider, _version, zone, total, silent, retired in counts:
        for table, key in ((providers, provider), (zones, zone or "none")):
            row = table.setdefault(key, [0, 0, 0])
            row[0] += total
            row[1] += silent
            row[2] += retired
    with_retired = any(row[5] for row in counts)

    def rows(table: dict[str, list[int]], link: Callable[[str], str]) -> str:
        ranked = sorted(table.items(), key=lambda item: (-item[1][1], item[0]))
        return "".join(
            f'<tr><th scope="row">{link(key)}</th><td>{total - silent - retired}</td>'
            f"<td{' class=alert' if silent else ''}>{silent}</td>"
            f"{_cell(retired) if with_retired else ''}<td>{total}</td></tr>"
            for key, (total, silent, retired) in ranked[:MAX_ZONE_ROWS]
        )

    retired_head = '<th scope="col">Retired</th>' if with_retired else ""
    head = (
        '<thead><tr><th scope="col">{}</th><th scope="col">Reporting</th>'
        f'<th scope="col">Silent</th>{retired_head}<th scope="col">Total</th></tr></thead>'
    )
    hidden = max(0, len(zones) - MAX_ZONE_ROWS)
    more = f'<p class="more">{hidden} more zones not shown.</p>' if hidden else ""
    return (
        '<section aria-labelledby="h-fleet"><h2 id="h-fleet">Instances</h2>'
        '<div class="scroll"><table id="by-provider"><caption>Instances by provider</caption>'
        f"{head.format('Provider')}<tbody>{rows(providers, escape)}</tbody></table></div>"
        '<div class="scroll"><table id="by-zone"><caption>Instances by zone</caption>'
        f"{head.format('Zone')}<tbody>"
        f"{rows(zones, _zone_link)}"
        f"</tbody></table></div>{more}</section>"
    )


def _cell(count: int) -> str:
    return f"<td>{count}</td>"


def _zone_link(zone: str) -> str:
    return f'<a href="/?{escape(urlencode({"zone": zone}))}">{escape(zone)}</a>'


def versions_table(counts: Mapping[str, Mapping[str, int]]) -> str:
    """Instances per sidecar version (`bridge.fleet.rollout`): a rollout's progress; the
    retired ones apart from the silent, in a column of their own when there are some."""
    if not counts:
        return ""
    with_retired = any(row.get("retired") for row in counts.values())
    rows = "".join(
        f'<tr><th scope="row"><code>{escape(version)}</code></th><td>{row["reporting"]}</td>'
        f"<td{' class=alert' if row['silent'] else ''}>{row['silent']}</td>"
        f"{_cell(row.get('retired', 0)) if with_retired else ''}"
        f"<td>{row['total']}</td></tr>"
        for version, row in counts.items()
    )
    retired_head = '<th scope="col">Retired</th>' if with_retired else ""
    return (
        '<section aria-labelledby="h-versions"><h2 id="h-versions">Versions</h2>'
        '<div class="scroll"><table id="versions"><caption>Instances per sidecar version'
        '</caption><thead><tr><th scope="col">Version</th><th scope="col">Reporting</th>'
        f'<th scope="col">Silent</th>{retired_head}<th scope="col">Total</th></tr></thead>'
        f"<tbody>{rows}</tbody></table></div></section>"
    )


# -- one instance ---------------------------------------------------------------------------


def _yes_no(value: bool | None) -> str | None:
    return None if value is None else ("yes" if value else "no")


def instance_page(
    instance: Mapping[str, Any] | None,
    name: str,
    eligibility: Mapping[str, Any] | None,
    in_force: Sequence[dict[str, Any]],
    history: Sequence[Mapping[str, Any]],
    heartbeats: int,
    days: float,
    now: float,
) -> str:
    if instance is None:
        return (
            f'<h1 id="instance-name">{escape(name)}</h1>'
            '<p class="empty">No event of this instance reached the fleet service.</p>'
        )
    state, _why = instance_state(instance, now)
    last = instance.get("last_heartbeat")
    # One age on the page, the ticking one under "Last heartbeat"; the state says only
    # what the age means (the reason's own age was frozen at render time and drifted apart).
    if last is None:
        state_text = f"{state}: no heartbeat received"
    elif state == "silent" and instance.get("heartbeat_interval"):
        limit = SILENT_AFTER_INTERVALS * float(instance.get("heartbeat_interval") or 0)
        state_text = f"silent: no heartbeat for more than {limit:g} s"
    else:
        state_text = state
    facts = [
        ("Provider", instance.get("provider")),
        ("Zone", instance.get("zone")),
        ("Scale set", instance.get("scale_set")),
        ("Project", instance.get("project")),
        ("Resource group", instance.get("resource_group")),
        ("Source", instance.get("source")),
        ("Agent version", instance.get("agent_version")),
        ("Watcher healthy", _yes_no(instance.get("watcher_healthy"))),
        ("Spool depth", instance.get("spool_depth")),
    ]
    facts_html = "".join(
        f"<div><dt>{escape(k)}</dt><dd>{escape(v)}</dd></div>" for k, v in facts if v is not None
    )
    beat = (
        f"{countdown(float(last), now)} (every {escape(instance.get('heartbeat_interval'))} s)"
        if last is not None
        else '<span class="muted">never</span>'
    )
    if eligibility is None:
        eligible_html = ""
    else:
        verdict = "eligible" if eligibility.get("eligible") else "not eligible"
        eligible_html = (
            f'<div><dt>Eligibility</dt><dd id="eligibility">{verdict}: '
            f"{escape(eligibility.get('reason'))}</dd></div>"
        )
    rows = []
    for entry in history:
        rows.append(
            f'<tr><td data-label="When">{countdown(entry["time"], now)}</td>'
            f'<td data-label="Time"><time datetime="{iso(entry["time"])}">'
            f"{readable(entry['time'])}</time></td>"
            f'<td data-label="Event">{escape(entry["type"])}</td>'
            f'<td data-label="Notice">{escape(entry["notice_id"])}</td>'
            f'<td data-label="Detail" class="detail">{escape(entry["detail"])}</td>'
            f'<td data-label="Ingest">{escape(entry["ingest"])}</td></tr>'
        )
    history_html = (
        '<div class="scroll"><table id="history" class="cards"><caption>Events of the last '
        f"{days:g} days, oldest first ({len(rows)}; {heartbeats} heartbeats not listed)"
        '</caption><thead><tr><th scope="col">When</th><th scope="col">Time</th>'
        '<th scope="col">Event</th><th scope="col">Notice</th><th scope="col">Detail</th>'
        f'<th scope="col">Ingest</th></tr></thead><tbody>{"".join(rows)}</tbody></table></div>'
        if rows
        else f'<p class="empty" id="history-empty">No maintenance event in the last {days:g} '
        f"days ({heartbeats} heartbeats).</p>"
    )
    return (
        f'<p><a href="/">← fleet</a></p><h1 id="instance-name">{escape(instance["name"])}</h1>'
        '<section aria-labelledby="h-state"><h2 id="h-state">State</h2><dl class="facts">'
        f'<div><dt>Sidecar</dt><dd id="sidecar-state">{escape(state_text)}</dd></div>'
        f'<div><dt>Last heartbeat</dt><dd id="heartbeat">{beat}</dd></div>'
        f'<div><dt>Identity</dt><dd id="attestation">'
        f"{attestation_badge(instance.get('attestation'))}</dd></div>"
        f"{eligible_html}{facts_html}</dl></section>"
        '<section aria-labelledby="h-inforce"><h2 id="h-inforce">Notices in force</h2>'
        f"{notices_table('now', 'Notices in force', in_force, now)}</section>"
        '<section aria-labelledby="h-history"><h2 id="h-history">History (audit log)</h2>'
        f"{history_html}</section>"
    )
