"""The fleet store interface: what any database behind the fleet service must do.

One call writes: `ingest` takes a batch from one ingest source and, in ONE transaction,
appends the events to the audit log, updates the instances and notices they describe,
records the rejected ones and moves the source's checkpoint. A source acknowledges its
transport (HTTP 2xx, Pub/Sub ack, Event Hubs checkpoint, Kafka commit) only after `ingest`
returned, so a crash at any point replays the batch and never loses it.

The rules every implementation keeps (tests/fleet/test_store.py runs against each):

- Idempotent on (`source`, `id`), the CloudEvents identity: an event already in the audit
  log is counted as a duplicate and changes nothing, whichever replica or source got it
  first. Two replicas writing the same stream into one PostgreSQL never double anything:
  the unique key decides (PostgreSQL's partitioned log keeps it in `event_keys`), the
  loser's insert does nothing.
- Out-of-order safe: a notice's state moves forward only (`bridge.fleet.state.RANK`); an
  older transition that arrives late is kept in the audit log and its transitions but never
  reverts the notice (a completed notice stays completed).
- The audit log is append-only: every accepted event as received (its exact bytes), with
  its receive time and the ingest source. Nothing updates it; only retention deletes what
  is older than the configured time (`bridge.fleet.retention`).
- Rejected input (not schema v1, unknown type) goes to the rejected table with the reason,
  so a bus source can acknowledge it and move on instead of looping on it.
- Checkpoints (`(ingest, partition) -> position`) commit with the events they cover, so a
  source that resumes from `checkpoint()` after a restart has no gap and no double.

Reads are for the API and the CLI: small, indexed queries whose answers are plain dicts
ready for JSON (`bridge.fleet.api` adds no logic of its own beyond the filters).

A PostgreSQL implementation: the same tables and statements (`bridge.fleet.sql` keeps to
the SQL both speak: `ON CONFLICT ... DO NOTHING / DO UPDATE ... WHERE`, `CASE` instead of
`MAX(a, b)`, REAL epoch seconds instead of timestamps), `?` placeholders rewritten to `%s`,
and `ingest` in a transaction at READ COMMITTED (the unique key and the conditional upserts
make concurrent replicas safe without stronger isolation).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, TypeVar

from bridge import contract
from bridge.fleet.paging import Page

T = TypeVar("T")


class StoreError(Exception):
    """The store cannot do what was asked (unreachable, disk full, corrupt); safe to show."""


class UnstorableError(ValueError):
    """The store refuses a value of the batch (out of its range), not the store's fault:
    retrying the same batch fails the same way, so the ingestor commits it one event at a
    time and refuses the event the store cannot hold (`bridge.fleet.sources.base`)."""


@dataclass(slots=True)
class Accepted:
    """One valid event as received: the typed value and its exact bytes, and (a bus
    message, screened alone) whether it came with a verified instance credential: None
    defers to `Batch.attested`, which a request's events share.

    Not frozen, unlike the other values here: one is built per event ingested, and a frozen
    dataclass's `__init__` (`object.__setattr__` per field) costs three times a plain one's
    (0.4 against 0.13 us). Nothing changes one after it is built."""

    event: contract.Event
    body: bytes
    attested: bool | None = None


@dataclass(frozen=True, slots=True)
class Refused:
    """Input that is not a valid event of schema v1: what came, and why it was refused."""

    body: bytes
    reason: str


@dataclass(frozen=True, slots=True)
class Batch:
    """What a source hands to the store in one transaction.

    `ingest` names the source (`http`, or a configured name) for the audit log and the
    metrics; `received_at` is the receive time (Unix seconds) of the whole batch;
    `checkpoints` are the source's positions (`partition -> position`) this batch reaches.
    """

    ingest: str
    received_at: float
    accepted: Sequence[Accepted] = ()
    refused: Sequence[Refused] = ()
    checkpoints: Mapping[str, str] = field(default_factory=dict)
    #: Whether the events came with a verified instance credential (#34): True, False (a
    #: source with `identity = "optional"` got none), None (the source checks no identity).
    #: Kept per instance (`attestation`) from its latest batch, in arrival order.
    attested: bool | None = None


@dataclass(frozen=True, slots=True)
class IngestResult:
    """How many of a batch's events were new, already known, refused."""

    accepted: int = 0
    duplicate: int = 0
    invalid: int = 0
    #: Receive time minus event time of each newly accepted event, seconds (metrics).
    lags: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class NoticeFilter:
    """`/v1/fleet/notices` filters; None matches everything. `instance` is a name or source;
    `search` a part of the instance, notice id, zone or source (the page's search box)."""

    provider: str | None = None
    zone: str | None = None
    kind: str | None = None
    status: str | None = None
    instance: str | None = None
    search: str | None = None


#: An instance's `attestation` (#34): its latest stored batch came with a verified instance
#: credential, with none (an `optional` source), or from a source that checks no identity.
ATTESTATIONS: Final = ("attested", "unattested", "unchecked")


@dataclass(frozen=True, slots=True)
class InstanceQuery:
    """`/v1/fleet/instances` and the page: a page of instances by (name, source) after
    `cursor` (`bridge.fleet.paging`). `state` is `reporting`, `silent` (at `now`) or
    `retired`; `search` matches a part of the name or source, case-insensitively (ASCII)."""

    state: str | None = None
    provider: str | None = None
    zone: str | None = None
    search: str | None = None
    cursor: str | None = None
    limit: int = 500
    now: float = 0.0
    #: `attested`, `unattested` or `unchecked` (what the instance's latest batch was, #34).
    attestation: str | None = None


@dataclass(frozen=True, slots=True)
class EventQuery:
    """`/v1/fleet/events`: the audit log after `cursor` (a sequence number), oldest first.

    `since`/`until` bound the event time (Unix seconds, inclusive/exclusive); `instance` is
    a name or a source.
    """

    instance: str | None = None
    type: str | None = None
    since: float | None = None
    until: float | None = None
    cursor: int = 0
    limit: int = 500


@dataclass(frozen=True, slots=True)
class EventPage:
    """A page of the audit log: (sequence, ingest, received_at, body) rows and the cursor
    of the next page (None at the end)."""

    rows: list[tuple[int, str, float, bytes]]
    next_cursor: int | None


#: `notice_page`'s start filter: a time (start at most then), "unknown", or None (any).
StartFilter = float | Literal["unknown"] | None


class Store(Protocol):
    """The fleet state (see the module docstring for the rules)."""

    async def open(self) -> None:
        """Connect and create the tables if needed (idempotent)."""

    async def close(self) -> None: ...

    async def ping(self) -> None:
        """Raise `StoreError` unless the store answers and commits now (readiness)."""

    async def ingest(self, batch: Batch) -> IngestResult:
        """Commit `batch` in one transaction (see the module docstring)."""

    async def ingest_many(self, batches: Sequence[Batch]) -> list[IngestResult]:
        """Commit `batches` in ONE transaction, applied in order as `ingest` would apply each
        (group commit, `bridge.fleet.group_commit`): all or none, a result per batch."""

    async def checkpoints(self, ingest: str) -> dict[str, str]:
        """The positions `ingest` committed, by partition (empty when it never ran)."""

    async def notices(self, where: NoticeFilter, *, in_force: bool = True) -> list[dict[str, Any]]:
        """Notices (in force, or all), each with its transitions, approvals and hooks; its
        current `event` is the bytes as received (`msgspec.Raw`: an encoder writes it as is,
        `msgspec.json.decode` reads it)."""

    async def instances(self, keys: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Every instance ever seen (or those whose name or source is in `keys`) with its
        identity, first/last seen and last heartbeat."""

    async def instances_in_force(self, keys: Sequence[str]) -> list[dict[str, Any]]:
        """The instances whose name or source is in `keys`, each with `notices` (the ids of
        its notices in force, soonest first) and `notice_events` (their current events, the
        bytes as received): one read for one instance's answer and for `eligible`."""

    async def instance_page(self, query: InstanceQuery) -> Page:
        """A page of instances (keyset, `bridge.fleet.paging`), each with `notices`: the ids
        of its notices in force."""

    async def notice_page(
        self, where: NoticeFilter, *, cursor: str | None, limit: int, starts: StartFilter = None
    ) -> Page:
        """A page of the notices in force in their order (soonest start first), keyset-paged;
        `starts` keeps those starting by a time (Unix seconds) or, "unknown", those with no
        known start (`upcoming`)."""

    async def notice_groups(self, where: NoticeFilter) -> list[tuple[str, str, str, str, int]]:
        """(provider, zone or "", kind, status, count) of the notices in force `where` selects
        (the page's headline, its table by zone and kind)."""

    async def rejected_page(self, *, cursor: str | None, limit: int) -> Page:
        """A page of the refused inputs, newest first."""

    async def events(self, query: EventQuery) -> EventPage: ...

    async def last_sequence(self) -> int:
        """The audit log's last sequence number, 0 when it is empty (an index lookup)."""

    async def rejected(self, limit: int = 100) -> list[dict[str, Any]]:
        """The latest refused inputs (newest first) with their reasons."""

    async def notice_counts(self) -> list[tuple[str, str | None, str, str, int]]:
        """(provider, zone, kind, status, count) of the notices in force (summary, metrics)."""

    async def counts(self) -> dict[str, int]:
        """Row counts: events, instances, notices, notices_in_force, rejected (kept as
        events arrive, `bridge.fleet.tallies`: no recount per call)."""

    async def instance_counts(self, now: float) -> list[tuple[str, str, str, int, int]]:
        """(provider, sidecar version, zone or "", instances, of which silent at `now`), from
        the tallies and the index of when each instance turns silent (never a pass over every
        row)."""

    async def retired_counts(self) -> list[tuple[str, str, str, int]]:
        """(provider, sidecar version, zone or "", instances retired), from the tallies:
        retired ones are among the silent of `instance_counts` (the page shows them apart)."""

    async def attestation_counts(self) -> dict[str, int]:
        """Instances by `attestation`: attested, unattested, unchecked (#34)."""

    async def transaction(self, fn: Callable[[Any], T]) -> T:
        """`fn(db)` in one write transaction, `db.execute(sql, params)` taking the `?` SQL
        both dialects speak: for the tables of other packages (the identity ledger,
        `bridge.fleet.identity.ledger`), which create their own."""
