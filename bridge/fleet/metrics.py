"""The fleet service's Prometheus metrics, rendered at scrape time with `bridge.infra.prometheus`.

Ingest figures are counted where they happen (`IngestStats`, fed by every source through
`bridge.fleet.sources.base.Ingestor`); the fleet figures (notices in force, instances by
state) are read from the store at scrape time, so they are right on every replica sharing
one PostgreSQL, not only on the one that ingested.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from bridge.fleet.state import fleet_rows
from bridge.fleet.store import IngestResult, Store, StoreError
from bridge.infra.prometheus import Exposition, Histogram

#: Ingest lag (receive time - event time), seconds: a live stream is sub-second, a backlog
#: replayed after an outage is hours.
LAG_BUCKETS: Final = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0)
OUTCOMES: Final = ("accepted", "duplicate", "invalid")


@dataclass
class AuthStats:
    """Failed credentials by reason (missing, malformed, unknown, stale, signature, ...) and
    requests answered 429, counted by `bridge.fleet.auth.FailureLimiter`."""

    failures: Counter[str] = field(default_factory=Counter)
    throttled: int = 0


@dataclass
class GroupStats:
    """Group commit's transactions and the posts (batches) they held
    (`bridge.fleet.group_commit`): their ratio is the size of the groups under load."""

    transactions: int = 0
    batches: int = 0


@dataclass
class IngestStats:
    """Ingest counters by (source, outcome) and the lag histogram by source."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    lag: dict[str, Histogram] = field(default_factory=dict)
    auth: AuthStats = field(default_factory=lambda: AuthStats())
    #: (when, why) of the last commit that failed, None once a commit succeeds (readiness).
    commit_failure: tuple[float, str] | None = None

    def failed(self, at: float, reason: str) -> None:
        """A source's commit failed (`StoreError`): not ready until one succeeds again."""
        self.commit_failure = (at, reason)

    #: Instance identity (bridge/fleet/identity/): events by (source, outcome: attested,
    #: unattested, refused_credential, refused_binding) and enrollments by outcome.
    identity: Counter[tuple[str, str]] = field(default_factory=Counter)
    enrollments: Counter[str] = field(default_factory=Counter)
    #: Requests answered 503 because the ingest queue was full, by source (back-pressure).
    overloaded: Counter[str] = field(default_factory=Counter)
    group: GroupStats = field(default_factory=GroupStats)

    def record(self, source: str, result: IngestResult) -> None:
        self.commit_failure = None
        self.counts[(source, "accepted")] += result.accepted
        self.counts[(source, "duplicate")] += result.duplicate
        self.counts[(source, "invalid")] += result.invalid
        histogram = self.lag.get(source)
        if histogram is None:
            histogram = self.lag[source] = Histogram(LAG_BUCKETS)
        for lag in result.lags:
            histogram.observe(max(0.0, lag))

    def refused(self, source: str, count: int = 1) -> None:
        """Input refused before it reached the store (unreadable request)."""
        self.counts[(source, "invalid")] += count


class _Source(Protocol):
    """What the scrape needs of a source (bridge.fleet.sources.base.Source)."""

    name: str

    def health(self) -> Any: ...


async def render(store: Store, stats: IngestStats, sources: Iterable[_Source]) -> str:
    """The exposition. A store that fails to answer turns `fleet_store_up` to 0 and leaves out
    the figures read from it, rather than failing the scrape: the ingest counters and the
    sources' state are what an operator needs most while the store is down."""
    sources = list(sources)
    out = Exposition()
    out.add(
        "fleet_source_up",
        "gauge",
        "1 when the ingest source consumes (what /readyz shows for it), 0 when it stopped.",
        (({"source": s.name}, 1 if s.health().ok else 0) for s in sources),
    )
    try:
        await _store_figures(out, store)
        store_up = 1
    except StoreError:
        store_up = 0
    out.add(
        "fleet_store_up",
        "gauge",
        "1 when the fleet store answered this scrape's reads, 0 when it failed.",
        [({}, store_up)],
    )
    names = sorted({s.name for s in sources} | {source for source, _ in stats.counts})
    out.add(
        "fleet_ingest_events_total",
        "counter",
        "Events received, by ingest source and outcome.",
        (
            ({"source": source, "outcome": outcome}, stats.counts[(source, outcome)])
            for source in names
            for outcome in OUTCOMES
        ),
    )
    out.add_histogram(
        "fleet_ingest_lag_seconds",
        "Receive time minus event time of newly accepted events.",
        (({"source": s}, stats.lag.setdefault(s, Histogram(LAG_BUCKETS))) for s in names),
    )
    out.add(
        "fleet_auth_failures_total",
        "counter",
        "Requests refused for a missing, malformed, stale or unknown credential, by reason.",
        (({"reason": reason}, n) for reason, n in sorted(stats.auth.failures.items())),
    )
    out.add(
        "fleet_auth_throttled_total",
        "counter",
        "Requests answered 429 because their address failed too many credentials.",
        [({}, stats.auth.throttled)],
    )
    out.add(
        "fleet_ingest_overloaded_total",
        "counter",
        "Posts answered 503 with Retry-After: the ingest queue was full, or max_requests were "
        "being handled.",
        (({"source": source}, stats.overloaded[source]) for source in names),
    )
    out.add(
        "fleet_ingest_group_transactions_total",
        "counter",
        "Store transactions of the http source's group commit.",
        [({}, stats.group.transactions)],
    )
    out.add(
        "fleet_ingest_group_batches_total",
        "counter",
        "Posts committed by those transactions (divided by them: the size of the groups).",
        [({}, stats.group.batches)],
    )
    if stats.identity or stats.enrollments:
        out.add(
            "fleet_identity_events_total",
            "counter",
            "Events by ingest source and identity outcome (refused ones are in `rejected`).",
            (({"source": s, "outcome": o}, n) for (s, o), n in sorted(stats.identity.items())),
        )
        out.add(
            "fleet_enrollments_total",
            "counter",
            "POST /v1/enroll answers, by outcome (issued, renewed, refused).",
            (({"outcome": o}, n) for o, n in sorted(stats.enrollments.items())),
        )
    return out.text()


async def _store_figures(out: Exposition, store: Store) -> None:
    """The figures read from the store at scrape time (right on every replica); all read
    before any is added, so a store failing midway adds none of them."""
    notices = await store.notice_counts()
    # Kept counts, no pass over rows; the retired apart from the silent, as the summary's.
    instances = fleet_rows(await store.instance_counts(time.time()), await store.retired_counts())
    counts: dict[str, Any] = await store.counts()
    counts.pop("instances_retired", None)  # the state="retired" figure of fleet_instances
    attestation = await store.attestation_counts()
    out.add(
        "fleet_notices_in_force",
        "gauge",
        "Maintenance notices in force (scheduled or started) across the fleet.",
        (
            ({"provider": p, "zone": z or "", "kind": k, "status": s}, n)
            for p, z, k, s, n in notices
        ),
    )
    states: Counter[str] = Counter({"reporting": 0, "silent": 0})
    for *_group, total, silent, retired in instances:
        states["reporting"] += total - silent - retired
        states["silent"] += silent
        if retired:  # the series appears once some are
            states["retired"] += retired
    out.add(
        "fleet_instances",
        "gauge",
        "Instances known to the fleet, by state (silent: 3 heartbeat intervals missed; "
        "retired: not heard from for [fleet.retention] retire_after_days).",
        (({"state": state}, n) for state, n in sorted(states.items())),
    )
    out.add(
        "fleet_instances_attestation",
        "gauge",
        "Instances by whether their latest stored events carried a verified instance "
        "credential (unchecked: their source checks no identity).",
        (({"attestation": state}, n) for state, n in sorted(attestation.items())),
    )
    out.add(
        "fleet_store_rows",
        "gauge",
        "Rows in the fleet store, by table.",
        (({"table": table}, n) for table, n in sorted(counts.items())),
    )
