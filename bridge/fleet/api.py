"""The fleet API: JSON over HTTP for dashboards, auditors and leader elections.

- `GET /v1/fleet/notices`: notices in force; filters `provider`, `zone`, `kind`, `status`,
  `instance` (a name or a source). Each with its transitions, approvals and hook outcomes.
- `GET /v1/fleet/upcoming?within=24h`: scheduled notices starting within the horizon,
  soonest first (`within`: seconds or `90m`, `24h`, `7d`; default 24h); scheduled ones with
  no known time are listed apart under `time_unknown`.
- `GET /v1/fleet/instances`: every instance, `reporting`, `silent` or `retired`, with its
  notices in force; `GET /v1/fleet/instances/{name or source}` one of them (404 when unknown).
- `GET /v1/fleet/eligible?instance=a&instance=b&horizon=3600`: each candidate eligible or
  not and why, `preferred` the first eligible one in the order given; 200 when one is, 503
  when none is (so `curl -f` fails) - see docs/fleet.md for etcd, Consul and Lease recipes.
- `GET /v1/fleet/summary`: counts by provider, zone, kind, status; instances by state,
  provider and sidecar version (`by_version`, to follow a rollout).
- `GET /v1/fleet/events?instance=&type=&since=&until=&cursor=&limit=`: the audit log as a
  CloudEvents batch (`application/cloudevents-batch+json`), the exact bytes received; the
  next page's cursor is in `Fleet-Next-Cursor` and a `Link: <...>; rel="next"` header.
- `GET /v1/fleet/rejected`: the latest refused inputs and why.
- `/metrics`, `/healthz` (the process answers), `/readyz` (the store answers and every
  source consumes).

Bad query values are 400 naming the parameter.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final

import msgspec
from aiohttp import web

from bridge.contract import from_cloudevent, rfc3339
from bridge.fleet import metrics, rollout, state
from bridge.fleet.config import FleetApi
from bridge.fleet.metrics import IngestStats
from bridge.fleet.sources.base import Source
from bridge.fleet.store import EventQuery, NoticeFilter, Store, StoreError
from bridge.infra.timeparse import TimeParseError, parse_time

BATCH_CONTENT_TYPE: Final = "application/cloudevents-batch+json"
PROMETHEUS_TEXT: Final = "text/plain; version=0.0.4; charset=utf-8"
_DURATION: Final = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNITS: Final = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _json(value: Any, status: int = 200) -> web.Response:
    """A JSON answer, encoded by msgspec (the notices of a large fleet are megabytes)."""
    return web.Response(
        body=msgspec.json.encode(value), status=status, content_type="application/json"
    )


class BadQuery(Exception):
    """A query parameter that cannot be used; the message names it."""


def duration(name: str, text: str) -> float:
    """Seconds of `3600`, `90m`, `24h`, `7d`."""
    match = _DURATION.match(text.strip())
    if not match:
        raise BadQuery(f"{name}: expected seconds or a duration like 90m, 24h, 7d")
    return float(match.group(1)) * _UNITS[match.group(2)]


def moment(name: str, text: str) -> float:
    """Unix seconds of an RFC 3339 time or a number of Unix seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return parse_time(text, naive_as_utc=False).timestamp()
    except TimeParseError as exc:
        raise BadQuery(f"{name}: expected an RFC 3339 time or Unix seconds: {exc}") from None


def epoch_rfc3339(seconds: float) -> str:
    """Unix seconds as the contract writes times (`contract.rfc3339`: UTC, `Z`)."""
    return rfc3339(datetime.fromtimestamp(seconds, UTC))


def _start(notice: dict[str, Any]) -> float | None:
    text = notice["not_before"] or (notice.get("window") or {}).get("start")
    return moment("not_before", text) if text else None


async def fleet_summary(store: Store) -> dict[str, Any]:
    """Instances by state, provider and version, notices in force by provider, zone, kind
    and status, the store's row counts (`/v1/fleet/summary` and `fleet status`)."""
    now = time.time()
    states: Counter[str] = Counter({"reporting": 0, "silent": 0, "retired": 0})
    providers: Counter[str] = Counter()
    instances = await store.instances()
    for instance in instances:
        states[state.instance_state(instance, now)[0]] += 1
        providers[instance["provider"]] += 1
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
            "by_version": rollout.by_version(instances, now),
        },
        "notices_in_force": {"total": total, **{f"by_{k}": dict(v) for k, v in by.items()}},
        "store": await store.counts(),
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
    return {
        **instance,
        **times,
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
        ):
            app.router.add_get(path, handler)

    @staticmethod
    @web.middleware
    async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
        """Bad queries are 400, an unreachable store 503; never a traceback to the client."""
        try:
            response: web.StreamResponse = await handler(request)
        except BadQuery as exc:
            return _json({"error": str(exc)}, status=400)
        except StoreError as exc:
            return _json({"error": f"fleet store: {exc}"}, status=503)
        return response

    # -- notices ----------------------------------------------------------------------------

    async def notices(self, request: web.Request) -> web.Response:
        query = request.query
        where = NoticeFilter(
            provider=query.get("provider"),
            zone=query.get("zone"),
            kind=query.get("kind"),
            status=query.get("status"),
            instance=query.get("instance"),
        )
        found = await self.store.notices(where)
        return _json({"count": len(found), "notices": found})

    async def upcoming(self, request: web.Request) -> web.Response:
        within = duration("within", request.query.get("within", "24h"))
        now = time.time()
        timed: list[tuple[float, dict[str, Any]]] = []
        unknown: list[dict[str, Any]] = []
        for notice in await self.store.notices(NoticeFilter(status="scheduled")):
            start = _start(notice)
            if start is None:
                unknown.append(notice)
            elif start <= now + within:
                notice["seconds_until"] = round(start - now, 1)
                timed.append((start, notice))
        timed.sort(key=lambda pair: pair[0])
        return _json(
            {
                "within_seconds": within,
                "count": len(timed),
                "notices": [n for _, n in timed],
                "time_unknown": unknown,
            }
        )

    # -- instances --------------------------------------------------------------------------

    async def instances(self, request: web.Request) -> web.Response:
        now = time.time()
        in_force: dict[str, list[str]] = {}
        for notice in await self.store.notices(NoticeFilter()):
            in_force.setdefault(notice["source"], []).append(notice["notice_id"])
        wanted = request.query.get("state")
        result = []
        for instance in await self.store.instances():
            current, why = state.instance_state(instance, now)
            if wanted and current != wanted:
                continue
            result.append(_instance_entry(instance, current, why, in_force))
        return _json({"count": len(result), "instances": result})

    async def instance(self, request: web.Request) -> web.Response:
        """One instance by name or source (of two VMs of one name, the one heard from last);
        an unknown one is 404 with the reason, like every other error, in JSON."""
        key = request.match_info["key"]
        rows = await self.store.instances([key])
        if not rows:
            return _json({"error": f"no instance named {key!r} reached the fleet"}, status=404)
        instance = max(rows, key=lambda row: row["last_seen"] or 0.0)
        notices = await self.store.notices(NoticeFilter(instance=instance["source"]))
        in_force = {instance["source"]: [n["notice_id"] for n in notices]}
        current, why = state.instance_state(instance, time.time())
        return _json(_instance_entry(instance, current, why, in_force))

    async def eligible(self, request: web.Request) -> web.Response:
        candidates = request.query.getall("instance", [])
        if not candidates:
            raise BadQuery("instance: name at least one candidate (instance=a&instance=b)")
        horizon = self.settings.eligible_horizon
        if "horizon" in request.query:
            horizon = duration("horizon", request.query["horizon"])
        rows = await self.store.instances(candidates)
        known = {key: row for row in rows for key in (row["name"], row["source"])}
        notices = {}
        for row in rows:
            found = await self.store.notices(NoticeFilter(instance=row["source"]))
            notices[row["source"]] = [from_cloudevent(n["event"]) for n in found]
        body = state.eligible(candidates, known, notices, time.time(), horizon)
        return _json(body, status=200 if body["preferred"] is not None else 503)

    async def summary(self, _request: web.Request) -> web.Response:
        return _json(await fleet_summary(self.store))

    # -- the audit log ----------------------------------------------------------------------

    async def events(self, request: web.Request) -> web.Response:
        query = request.query
        try:
            cursor = int(query.get("cursor", "0"))
            limit = int(query.get("limit", str(self.settings.page_size)))
        except ValueError:
            raise BadQuery("cursor and limit must be integers") from None
        if cursor < 0 or not 1 <= limit <= self.settings.page_size:
            raise BadQuery(f"limit must be 1..{self.settings.page_size}, cursor >= 0")
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

    async def rejected(self, _request: web.Request) -> web.Response:
        found = await self.store.rejected()
        return _json({"count": len(found), "rejected": found})

    # -- operations -------------------------------------------------------------------------

    async def metrics(self, _request: web.Request) -> web.Response:
        text = await metrics.render(self.store, self.stats, [s.name for s in self.sources])
        return web.Response(body=text.encode(), headers={"Content-Type": PROMETHEUS_TEXT})

    async def healthz(self, _request: web.Request) -> web.Response:
        return _json({"status": "ok", "checks": [{"name": "process", "ok": True}]})

    async def readyz(self, _request: web.Request) -> web.Response:
        checks = []
        try:
            await self.store.ping()
            checks.append({"name": "store", "ok": True, "detail": "answers"})
        except StoreError as exc:
            checks.append({"name": "store", "ok": False, "detail": str(exc)})
        for source in self.sources:
            health = source.health()
            checks.append(
                {"name": f"source:{source.name}", "ok": health.ok, "detail": health.detail}
            )
        ok = all(check["ok"] for check in checks)
        return _json(
            {"status": "ok" if ok else "failing", "checks": checks}, status=200 if ok else 503
        )
