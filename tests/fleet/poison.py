"""Events the schema admits but the fleet must refuse (`bridge.fleet.bounds`), as structured
JSON bodies: each is one bad event, and must stay one bad event on every ingest path."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from bridge.pipeline.model import Status
from tests.fleet.factories import azure_vm, heartbeat, transition

#: Valid RFC 3339, but year 10000 once in UTC (and year 0 the other way round).
PAST_9999 = "9999-12-31T23:59:59-01:00"
BEFORE_1 = "0001-01-01T00:00:00+01:00"


def _edited(body: bytes, edit: Any, suffix: str) -> bytes:
    event = json.loads(body)
    event["id"] = f"{event['id']}-{suffix}"
    edit(event)
    return json.dumps(event).encode()


def poison(at: datetime) -> dict[str, bytes]:
    """By name: one body per bound, each otherwise a valid event of VM `poison-1`."""
    vm = azure_vm("poison-1")
    beat = heartbeat(vm, at)
    notice = transition(vm, "ev-p", Status.SCHEDULED, at, not_before=at)

    def data(key: str, value: Any) -> Any:
        return lambda event: event["data"].__setitem__(key, value)

    deep: Any = "bottom"
    for _ in range(100):
        deep = [deep]
    return {
        "time past 9999": _edited(notice, lambda e: e.__setitem__("time", PAST_9999), "t"),
        "not_before past 9999": _edited(notice, data("not_before", PAST_9999), "nb"),
        "window before year 1": _edited(
            notice,
            data("window", {"start": BEFORE_1, "end": None, "latest_start": None}),
            "w",
        ),
        "started_at past 9999": _edited(beat, data("started_at", PAST_9999), "s"),
        "spool_depth past 2^63": _edited(beat, data("spool_depth", 2**63), "d"),
        "interval of a year": _edited(beat, data("interval_seconds", 365 * 86400.0), "i"),
        "string of 100,000": _edited(notice, data("description", "x" * 100_000), "l"),
        "nested 100 deep": _edited(notice, data("raw", deep), "n"),
        "not UTF-8": _edited(notice, data("description", "caf\u00e9"), "u").replace(
            b"\\u00e9", b"\xe9"
        ),
    }


def nested(depth: int) -> bytes:
    """JSON nested `depth` deep (past the decoder's recursion limit when large)."""
    return b'{"a":' + b"[" * depth + b"]" * depth + b"}"
