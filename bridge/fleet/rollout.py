"""Which builds the fleet runs: instances per sidecar version, to follow a rollout.

Each sidecar's heartbeat names its build (`agent_version`, `0.2.0+g1a2b3c4`; see
`bridge.infra.buildinfo`), and the store keeps the latest one per instance. During a wave the
old version's count falls and the new one's rises; a new version whose instances turn
`silent` is a rollout to stop. An instance that never sent a heartbeat (a build older than
heartbeats, or heartbeats off) is counted under `unknown`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from bridge.fleet.state import instance_state
from bridge.infra.buildinfo import release_of

UNKNOWN: Final = "unknown"


def by_version(instances: Iterable[Mapping[str, Any]], now: float) -> dict[str, dict[str, int]]:
    """`{version: {"total", "reporting", "silent"[, "retired"]}}`, the newest release first
    (builds of one release by name), `unknown` last."""
    counts: dict[str, dict[str, int]] = {}
    for instance in instances:
        version = instance.get("agent_version") or UNKNOWN
        row = counts.setdefault(version, {"total": 0, "reporting": 0, "silent": 0})
        row["total"] += 1
        state = instance_state(instance, now)[0]
        row[state] = row.get(state, 0) + 1  # `retired` only where there are some
    return _ordered(counts)


def by_version_counts(
    rows: Iterable[tuple[str, str, str, int, int] | tuple[str, str, str, int, int, int]],
) -> dict[str, dict[str, int]]:
    """`by_version` from the store's `instance_counts` rows (provider, version, zone, total,
    silent), without reading the instances; rows with a sixth figure, the retired ones
    (`bridge.fleet.state.fleet_rows`: not among their silent), count them apart."""
    counts: dict[str, dict[str, int]] = {}
    for _provider, version, _zone, total, silent, *retired in rows:
        row = counts.setdefault(version or UNKNOWN, {"total": 0, "reporting": 0, "silent": 0})
        gone = retired[0] if retired else 0
        row["total"] += total
        row["silent"] += silent
        row["reporting"] += total - silent - gone
        if gone:
            row["retired"] = row.get("retired", 0) + gone
    return _ordered(counts)


def _ordered(counts: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    def order(version: str) -> tuple[bool, tuple[int, ...], str]:
        return (version == UNKNOWN, tuple(-n for n in release_of(version)), version)

    return {version: counts[version] for version in sorted(counts, key=order)}
