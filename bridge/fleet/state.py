"""The rules of the fleet state, as pure functions both stores and the API share.

- A notice moves forward only: scheduled < started < completed = cancelled (`RANK`). Between
  two events of the same rank the later event time wins (an Azure event rescheduled while
  Scheduled), and a finished notice (rank 2) never changes again. Each store applies this
  in SQL (`bridge.fleet.sql.UPSERT_NOTICE`); `newer` is the same rule for Python callers.
- An instance is `reporting` while its last heartbeat is younger than
  `SILENT_AFTER_INTERVALS` of its own announced interval, else `silent` (also when it never
  sent one: an old sidecar or heartbeats off; nobody vouches that it is watching), and
  `retired` once retention marked it (not heard from for `retire_after_days`).
- A zone is named so that it is unique across the fleet (`zone_of`): an Azure zone is a
  number within its region, so the fleet writes it `<location>-<zone>`.
- Eligibility is the sidecar's own rule (`bridge.eligibility`) applied to the instance's
  notices in force, plus: an unknown, silent or retired instance is never eligible.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from bridge import contract

# The one naming of zones, shared with the sidecar's budget (`[coordination] zone_naming`).
from bridge.contract import zone_of as zone_of
from bridge.eligibility import eligibility

RANK: Final = {"scheduled": 0, "started": 1, "completed": 2, "cancelled": 2}
FINISHED_RANK: Final = 2
IN_FORCE: Final = ("scheduled", "started")
SILENT_AFTER_INTERVALS: Final = 3


def newer(old_status: str, old_time: float, new_status: str, new_time: float) -> bool:
    """Whether an event (new_status at new_time) replaces a notice's current state."""
    old_rank, new_rank = RANK[old_status], RANK[new_status]
    if old_rank == FINISHED_RANK:
        return False
    return new_rank > old_rank or (new_rank == old_rank and new_time >= old_time)


def instance_state(instance: Mapping[str, Any], now: float) -> tuple[str, str]:
    """(`reporting`, `silent` or `retired`, why) for an instance row of the store;
    `retired` is set by retention (`bridge.fleet.retention`) and cleared by its next event."""
    retired = instance.get("retired_at")
    if retired is not None:
        days = (now - float(instance["last_seen"])) / 86400
        return "retired", f"not heard from for {days:.0f} days"
    last, interval = instance.get("last_heartbeat"), instance.get("heartbeat_interval")
    if last is None or not interval:
        return "silent", "no heartbeat received"
    age = now - float(last)
    limit = SILENT_AFTER_INTERVALS * float(interval)
    if age > limit:
        return "silent", f"last heartbeat {age:.0f}s ago (more than {limit:g}s)"
    return "reporting", f"last heartbeat {age:.0f}s ago"


def eligible(
    candidates: Sequence[str],
    instances: Mapping[str, Mapping[str, Any]],
    notices: Mapping[str, Iterable[contract.Event]],
    now: float,
    horizon: float,
) -> dict[str, Any]:
    """For each candidate (a name or a source): eligible or not and why; `preferred` is the
    first eligible one in the order given (None when none is).

    `instances` maps names and sources to instance rows; `notices` maps a source to the
    current events (`contract.Event`, decoded from the stored bytes) of its notices in force.
    """
    answers = []
    moment = datetime.fromtimestamp(now, UTC)
    for candidate in candidates:
        instance = instances.get(candidate)
        if instance is None:
            answers.append({"instance": candidate, "eligible": False, "reason": "unknown instance"})
            continue
        state, why = instance_state(instance, now)
        ok, body = eligibility(notices.get(instance["source"], ()), moment, horizon)
        if state != "reporting":
            ok, body["reason"] = False, f"{state}: {why}"
        answers.append(
            {
                "instance": candidate,
                "name": instance["name"],
                "source": instance["source"],
                "state": state,
                **body,
                "eligible": ok,
            }
        )
    preferred = next((a["instance"] for a in answers if a["eligible"]), None)
    return {"horizon_seconds": horizon, "preferred": preferred, "candidates": answers}


#: (provider, sidecar version, zone or "", instances, silent, retired): the store's counts
#: of instances with the retired ones apart (`fleet_rows`).
FleetRow = tuple[str, str, str, int, int, int]


def fleet_rows(
    counts: Iterable[tuple[str, str, str, int, int]],
    retired: Iterable[tuple[str, str, str, int]],
) -> list[FleetRow]:
    """The store's `instance_counts` with its `retired_counts` taken out of the silent:
    retention retires instances not heard from for weeks, which the silent count holds too,
    and a deleted VM is not an alarm."""
    gone = {(p, v, z): n for p, v, z, n in retired}
    rows = []
    for provider, version, zone, total, silent in counts:
        out = min(gone.get((provider, version, zone), 0), silent)
        rows.append((provider, version, zone, total, silent - out, out))
    return rows
