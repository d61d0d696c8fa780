"""The fleet API: JSON over HTTP for dashboards, auditors and leader elections.

- `GET /v1/fleet/notices`: notices in force; filters `provider`, `zone`, `kind`, `status`,
  `instance` (a name or a source). Each with its transitions, approvals and hook outcomes.
- `GET /v1/fleet/upcoming?within=24h`: scheduled notices starting within the horizon,
  soonest first (`within`: seconds or `90m`, `24h`, `7d`; default 24h); scheduled ones with
  no known time are listed apart under `time_unknown`.
- `GET /v1/fleet/instances`: instances by name, `reporting`, `silent` or `retired`, with the
  ids of their notices in force and whether their latest events were attested (filters
  `state`, `provider`, `zone`, `q`, `attestation`);
  `GET /v1/fleet/instances/{name or source}` one of them (404 when unknown).
- `GET /v1/fleet/eligible?instance=a&instance=b&horizon=3600`: each candidate eligible or
  not and why, `preferred` the first eligible one in the order given; 200 when one is, 503
  when none is (so `curl -f` fails) - see docs/fleet.md for etcd, Consul and Lease recipes.
- `GET /v1/fleet/summary`: counts by provider, zone, kind, status; instances by state,
  provider, sidecar version (`by_version`, to follow a rollout) and attestation
  (`by_attestation`, to follow a move to `identity = "required"`).
- `GET /v1/fleet/events?instance=&type=&since=&until=&cursor=&limit=`: the audit log as a
  CloudEvents batch (`application/cloudevents-batch+json`), the exact bytes received; the
  next page's cursor is in `Fleet-Next-Cursor` and a `Link: <...>; rel="next"` header.
- `GET /v1/fleet/rejected`: the refused inputs and why, newest first.
- `GET /v1/openapi.json`: the OpenAPI 3.1 document of all this (`bridge/fleet/openapi.json`).
- `/metrics`, `/healthz` (the process answers), `/readyz` (the store answers and commits,
  no ingest failed to commit in the last minute, and every source consumes).

The lists (notices, upcoming, instances, rejected) are keyset-paged (`bridge.fleet.paging`):
`limit` rows (default 100, at most `[fleet.api] page_size`) and `next`, the cursor to pass
back as `cursor` (also `Fleet-Next-Cursor` and `Link: rel="next"`). `/v1` promises are in
docs/fleet.md ("What `/v1` promises"): a `next` cursor and new fields are additive.

Bad query values are 400 naming the parameter.
"""

from __future__ import annotations

import functools
import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any, Final, get_args

import msgspec
from aiohttp import web

from bridge import contract
from bridge.contract import epoch_rfc3339, from_cloudevent
from bridge.fleet import metrics, rollout, state
from bridge.fleet.config import FleetApi
from bridge.fleet.metrics import IngestStats
from bridge.fleet.paging import DEFAULT_PAGE_SIZE, BadCursor
from bridge.fleet.sources.base import Source
from bridge.fleet.store import (
    ATTESTATIONS,
    EventQuery,
    InstanceQuery,
    NoticeFilter,
    Store,
    StoreError,
)
from bridge.infra.timeparse import TimeParseError, parse_time

BATCH_CONTENT_TYPE: Final = "application/cloudevents-batch+json"
PROMETHEUS_TEXT: Final = "text/plain; version=0.0.4; charset=utf-8"
_DURATION: Final = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNITS: Final = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: Horizons (`within`, `horizon`) longer than this are refused (10 years).
MAX_DURATION: Final = 10 * 365 * 86400.0
#: Unix seconds of 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z: times a query may name.
FIRST_SECOND: Final = -62135596800.0
LAST_SECOND: Final = 253402300799.0
#: Candidates of one `/v1/fleet/eligible` question (each is a store query).
MAX_CANDIDATES: Final = 500
#: A cursor is a sequence number: the stores' 64-bit integer.
MAX_CURSOR: Final = 2**63 - 1
#: Seconds /readyz stays failing after an ingest could not commit (unless one commits since):
#: a small probe commit can pass where a batch does not (a full disk), and a replica taken
#: out of rotation gets no new ingest to prove it can commit again.
COMMIT_FAILURE_HOLD: Final = 60.0
PROVIDERS: Final = get_args(contract.ProviderName)
KINDS: Final = get_args(contract.KindName)
STATUSES: Final = get_args(contract.StatusName)
STATES: Final = ("reporting", "silent", "retired")


def _json(value: Any, status: int = 200) -> web.Response:
    """A JSON answer, encoded by msgspec (the notices of a large fleet are megabytes)."""
    return web.Response(
        body=msgspec.json.encode(value), status=status, content_type="application/json"
    )


@functools.cache
def _openapi() -> bytes:
    return (resources.files("bridge.fleet") / "openapi.json").read_bytes()


class BadQuery(Exception):
    """A query parameter that cannot be used; the message names it."""


def duration(name: str, text: str) -> float:
    """Seconds of `3600`, `90m`, `24h`, `7d`, at most `MAX_DURATION`."""
    match = _DURATION.match(text.strip())
    if not match:
        raise BadQuery(f"{name}: expected seconds or a duration like 90m, 24h, 7d")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds > MAX_DURATION:
        raise BadQuery(f"{name}: at most {MAX_DURATION:g} seconds (10 years)")
    return seconds


def moment(name: str, text: str) -> float:
    """Unix seconds of an RFC 3339 time or a number of Unix seconds, within years 1-9999."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = parse_time(text, naive_as_utc=False).timestamp()
        except (TimeParseError, OverflowError) as exc:
            raise BadQuery(f"{name}: expected an RFC 3339 time or Unix seconds: {exc}") from None
    if not FIRST_SECOND <= seconds <= LAST_SECOND:  # also nan and inf
        raise BadQuery(f"{name}: {text!r} is not a time within years 1-9999")
    return seconds


def integer(name: str, text: str, low: int, high: int) -> int:
    """An integer query parameter within `low..high`."""
    try:
        value = int(text)
    except ValueError:
        raise BadQuery(f"{name}: expected an integer, got {text!r}") from None
    if not low <= value <= high:
        raise BadQuery(f"{name}: must be {low}..{high}")
    return value


def choice(query: Mapping[str, str], name: str, allowed: Sequence[str]) -> str | None:
    """An enum query parameter: absent (None) or one of `allowed`."""
    value = query.get(name)
    if value is not None and value not in allowed:
        raise BadQuery(f"{name}: {value!r} is not one of {', '.join(allowed)}")
    return value


def _start(notice: dict[str, Any]) -> float | None:
    text = notice["not_before"] or (notice.get("window") or {}).get("start")
    return moment("not_before", text) if text else None


async def fleet_summary(store: Store) -> dict[str, Any]:
    """Instances by state, provider and version, notices in force by provider, zone, kind
    and status, the store's row counts (`/v1/fleet/summary` and `fleet status`): all from the
    counts the store keeps as events arrive (`bridge.fleet.tallies`), never a recount."""
    now = time.time()
    states: Counter[str] = Counter({"reporting": 0, "silent": 0, "retired": 0})
    providers: Counter[str] = Counter()
    # Retired instances are counted apart from the silent, per group, as the page does.
    rows = state.fleet_rows(await store.instance_counts(now), await store.retired_counts())
    for provider, _version, _zone, total, silent, retired in rows:
        states["reporting"] += total - silent - retired
        states["silent"] += silent
        states["retired"] += retired
        providers[provider] += total
    counts = await store.counts()
    by: dict[str, Counter[str]] = {k: Counter() for k in ("provider", "zone", "kind", "status")}
    total = 0
    for provider, zone, kind, status, count in await store.notice_counts():
        total += count
        for key, value in (
            ("provider", provider),
            ("zone", zone or "none"),
            ("kind", kind),
            ("status", status),
        ):
            by[key][value] += count
    return {
        "instances": {
            "total": sum(states.values()),
            **states,
            "by_provider": dict(providers),
            "by_version": rollout.by_version_counts(rows),
            "by_attestation": await store.attestation_counts(),
        },
        "notices_in_force": {"total": total, **{f"by_{k}": dict(v) for k, v in by.items()}},
        "store": counts,
    }


#: The epoch-seconds fields of an instance and their RFC 3339 twins. The floats are deprecated
#: (every other answer writes RFC 3339) and go with /v2 (CHANGELOG, docs/fleet.md).
INSTANCE_TIMES: Final = {
    "first_seen": "first_seen_at",
    "last_seen": "last_seen_at",
    "last_heartbeat": "last_heartbeat_at",
    "started_at": "agent_started_at",
}


def _instance_entry(
    instance: dict[str, Any], current: str, why: str, in_force: dict[str, list[str]]
) -> dict[str, Any]:
    """An instance as `/v1/fleet/instances` writes it: the store's row, its times also in
    RFC 3339, its state and why, the ids of its notices in force."""
    times = {
        twin: None if instance[field] is None else epoch_rfc3339(instance[field])
        for field, twin in INSTANCE_TIMES.items()
    }
    retired = instance.get("retired_at")
    return {
        **instance,
        **times,
        "retired_at": None if retired is None else epoch_rfc3339(retired),  # new: RFC 3339 only
        "state": current,
        "state_reason": why,
        "notices": in_force.get(instance["source"], []),
    }


class FleetApiRoutes:
    """The handlers, bound to one store, the ingest stats and the sources."""

    def __init__(
        self, store: Store, settings: FleetApi, stats: IngestStats, sources: Sequence[Source]
    ) -> None:
        self.store = store
        self.settings = settings
        self.stats = stats
        self.sources = list(sources)

    def add_routes(self, app: web.Application) -> None:
        for path, handler in (
            ("/v1/fleet/notices", self.notices),
            ("/v1/fleet/upcoming", self.upcoming),
            ("/v1/fleet/instances", self.instances),
            ("/v1/fleet/instances/{key:.+}", self.instance),
            ("/v1/fleet/eligible", self.eligible),
            ("/v1/fleet/summary", self.summary),
            ("/v1/fleet/events", self.events),
            ("/v1/fleet/rejected", self.rejected),
            ("/metrics", self.metrics),
            ("/healthz", self.healthz),
            ("/readyz", self.readyz),
            ("/v1/openapi.json", self.openapi),
        ):
            app.router.add_get(path, handler)

    @staticmethod
    @web.middleware
    async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
        """Bad queries are 400, an unreachable store 503; never a traceback to the client. Under
        /v1/ an unknown path or method is JSON like every other answer of the API (aiohttp's
        own are text), so a client parses one error shape."""
        try:
            response: web.StreamResponse = await handler(request)
        except (BadQuery, BadCursor) as exc:
            return _json({"error": str(exc)}, status=400)
        except StoreError as exc:
            return _json({"error": f"fleet store: {exc}"}, status=503)
        except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as exc:
            if not request.path.startswith("/v1/"):
                raise
            reason = f"{exc.reason}: {request.method} {request.path}"[:300]
            answer = _json({"error": reason}, status=exc.status)
            if "Allow" in exc.headers:
                answer.headers["Allow"] = exc.headers["Allow"]
            return answer
        return response

    # -- notices ----------------------------------------------------------------------------

    def _page(self, request: web.Request) -> tuple[str | None, int]:
        """The `cursor` and `limit` of a paged list (`bridge.fleet.paging`)."""
        cursor = request.query.get("cursor") or None
        text = request.query.get("limit")
        if text is None:
            return cursor, min(DEFAULT_PAGE_SIZE, self.settings.page_size)
        try:
            limit = int(text)
        except ValueError:
            raise BadQuery("limit: expected an integer") from None
        if not 1 <= limit <= self.settings.page_size:
            raise BadQuery(f"limit: must be 1..{self.settings.page_size}")
        return cursor, limit

    @staticmethod
    def _paged(request: web.Request, body: dict[str, Any], following: str | None) -> web.Response:
        """A page's answer: `next` in the body (null on the last page), and, as for the audit
        log, `Fleet-Next-Cursor` and a `Link: <...>; rel="next"` header."""
        body["next"] = following
        response = _json(body)
        if following is not None:
            url = request.rel_url.update_query(cursor=following)
            response.headers["Fleet-Next-Cursor"] = following
            response.headers["Link"] = f'<{url}>; rel="next"'
        return response

    async def notices(self, request: web.Request) -> web.Response:
        query = request.query
        where = NoticeFilter(
            provider=choice(query, "provider", PROVIDERS),
            zone=query.get("zone"),
            kind=choice(query, "kind", KINDS),
            status=choice(query, "status", STATUSES),
            instance=query.get("instance"),
        )
        cursor, limit = self._page(request)
        page = await self.store.notice_page(where, cursor=cursor, limit=limit)
        return self._paged(request, {"count": len(page.rows), "notices": page.rows}, page.next)

    async def upcoming(self, request: web.Request) -> web.Response:
        """Scheduled notices starting within the horizon, soonest first, paged; the first
        page also lists (up to a page of) those whose start is unknown."""
        within = duration("within", request.query.get("within", "24h"))
        cursor, limit = self._page(request)
        now = time.time()
        scheduled = NoticeFilter(status="scheduled")
        page = await self.store.notice_page(
            scheduled, cursor=cursor, limit=limit, starts=now + within
        )
        for notice in page.rows:
            start = _start(notice)
            notice["seconds_until"] = None if start is None else round(start - now, 1)
        unknown = []
        if cursor is None:
            unknown = (
                await self.store.notice_page(scheduled, cursor=None, limit=limit, starts="unknown")
            ).rows
        body = {
            "within_seconds": within,
            "count": len(page.rows),
            "notices": page.rows,
            "time_unknown": unknown,
        }
        return self._paged(request, body, page.next)

    # -- instances --------------------------------------------------------------------------

    async def instances(self, request: web.Request) -> web.Response:
        query = request.query
        wanted = choice(query, "state", STATES)
        cursor, limit = self._page(request)
        now = time.time()
        page = await self.store.instance_page(
            InstanceQuery(
                state=wanted,
                provider=choice(query, "provider", PROVIDERS),
                zone=query.get("zone"),
                search=query.get("q") or None,
                cursor=cursor,
                limit=limit,
                now=now,
                attestation=choice(query, "attestation", ATTESTATIONS),
            )
        )
        result = []
        for instance in page.rows:
            current, why = state.instance_state(instance, now)
            notices = {instance["source"]: instance.pop("notices")}
            result.append(_instance_entry(instance, current, why, notices))
        return self._paged(request, {"count": len(result), "instances": result}, page.next)

    async def instance(self, request: web.Request) -> web.Response:
        """One instance by name or source (of two VMs of one name, the one heard from last);
        an unknown one is 404 with the reason, like every other error, in JSON."""
        key = request.match_info["key"]
        rows = await self.store.instances_in_force([key])
        if not rows:
            return _json({"error": f"no instance named {key!r} reached the fleet"}, status=404)
        instance = max(rows, key=lambda row: row["last_seen"] or 0.0)
        del instance["notice_events"]
        in_force = {instance["source"]: instance.pop("notices")}
        current, why = state.instance_state(instance, time.time())
        return _json(_instance_entry(instance, current, why, in_force))

    async def eligible(self, request: web.Request) -> web.Response:
        candidates = request.query.getall("instance", [])
        if not candidates:
            raise BadQuery("instance: name at least one candidate (instance=a&instance=b)")
        if len(candidates) > MAX_CANDIDATES:
            raise BadQuery(f"instance: at most {MAX_CANDIDATES} candidates")
        horizon = self.settings.eligible_horizon
        if "horizon" in request.query:
            horizon = duration("horizon", request.query["horizon"])
        # One read: the candidates and the current events of their notices in force.
        rows = await self.store.instances_in_force(candidates)
        known = {key: row for row in rows for key in (row["name"], row["source"])}
        notices = {
            row["source"]: [from_cloudevent(body) for body in row["notice_events"]] for row in rows
        }
        body = state.eligible(candidates, known, notices, time.time(), horizon)
        return _json(body, status=200 if body["preferred"] is not None else 503)

    async def summary(self, _request: web.Request) -> web.Response:
        return _json(await fleet_summary(self.store))

    # -- the audit log ----------------------------------------------------------------------

    async def events(self, request: web.Request) -> web.Response:
        query = request.query
        cursor = integer("cursor", query.get("cursor", "0"), 0, MAX_CURSOR)
        limit = integer(
            "limit", query.get("limit", str(self.settings.page_size)), 1, self.settings.page_size
        )
        page = await self.store.events(
            EventQuery(
                instance=query.get("instance"),
                type=query.get("type"),
                since=moment("since", query["since"]) if "since" in query else None,
                until=moment("until", query["until"]) if "until" in query else None,
                cursor=cursor,
                limit=limit,
            )
        )
        body = b"[" + b",".join(row[3] for row in page.rows) + b"]"
        headers = {}
        if page.next_cursor is not None:
            following = request.rel_url.update_query(cursor=str(page.next_cursor))
            headers["Fleet-Next-Cursor"] = str(page.next_cursor)
            headers["Link"] = f'<{following}>; rel="next"'
        return web.Response(body=body, content_type=BATCH_CONTENT_TYPE, headers=headers)

    async def rejected(self, request: web.Request) -> web.Response:
        cursor, limit = self._page(request)
        page = await self.store.rejected_page(cursor=cursor, limit=limit)
        return self._paged(request, {"count": len(page.rows), "rejected": page.rows}, page.next)

    # -- operations -------------------------------------------------------------------------

    async def metrics(self, _request: web.Request) -> web.Response:
        text = await metrics.render(self.store, self.stats, self.sources)
        return web.Response(body=text.encode(), headers={"Content-Type": PROMETHEUS_TEXT})

    async def openapi(self, _request: web.Request) -> web.Response:
        """The OpenAPI 3.1 document of this API (package data, `bridge/fleet/openapi.json`)."""
        return web.Response(body=_openapi(), content_type="application/json")

    async def healthz(self, _request: web.Request) -> web.Response:
        return _json({"status": "ok", "checks": [{"name": "process", "ok": True}]})

    async def readyz(self, _request: web.Request) -> web.Response:
        checks = []
        failure = self.stats.commit_failure
        try:
            await self.store.ping()
        except StoreError as exc:
            checks.append({"name": "store", "ok": False, "detail": str(exc)})
        else:
            if failure is not None and time.time() - failure[0] < COMMIT_FAILURE_HOLD:
                detail = f"the last ingest could not commit: {failure[1]}"
                checks.append({"name": "store", "ok": False, "detail": detail})
            else:
                checks.append({"name": "store", "ok": True, "detail": "answers and commits"})
        for source in self.sources:
            health = source.health()
            checks.append(
                {"name": f"source:{source.name}", "ok": health.ok, "detail": health.detail}
            )
        ok = all(check["ok"] for check in checks)
        return _json(
            {"status": "ok" if ok else "failing", "checks": checks}, status=200 if ok else 503
        )
