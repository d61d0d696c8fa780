"""What an ingest source implements, and the one path by which events reach the store.

A source (HTTP, Pub/Sub, Event Hubs, Kafka) receives bodies from its transport and hands
them to `Ingestor.commit`, which checks each against the contract (`bridge.contract`),
commits the valid ones, the refused ones and the source's checkpoints in one store
transaction, and counts the outcome. The source acknowledges its transport only after
`commit` returned:

- HTTP answers 2xx after the commit, 400 naming the reasons when something was refused.
- Pub/Sub (streaming pull): ack each message after the commit of the batch that holds it;
  a refused message is recorded in the rejected table and acked too, so it cannot loop.
- Event Hubs: pass `checkpoints={partition: offset}` to `commit`; the store keeps them in
  the same transaction as the events, so no Blob storage is needed; resume from
  `Ingestor.store.checkpoints(name)` after a restart, with no gap.
- Kafka: commit offsets to the broker after `commit` (or keep them in the store like Event
  Hubs and seek on assignment).

Every body passes `classify`, so the contract and the fleet's bounds (`bridge.fleet.bounds`)
are checked on every path alike. A store that refuses an event of a batch for its content
(`UnstorableError`, or any error but `StoreError`) gets the batch again one event at a
time, and the event it refuses is recorded as refused: one bad event never stalls a source.

A `commit` that raises `StoreError` has written nothing the source could miss (what it did
write is in the audit log, so the replay counts it as a duplicate): the source must not ack
and should retry with backoff (`bridge.infra.backoff`), keeping its transport's redelivery as
the safety net; `/readyz` says the store cannot commit until a commit succeeds again.
`health()` is what `/readyz` shows for the source; it should turn false when the source
stops consuming (stream broken, consumer not assigned), not on a single transient error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from bridge import contract
from bridge.fleet import bounds
from bridge.fleet.group_commit import GroupCommit, Overloaded
from bridge.fleet.metrics import IngestStats
from bridge.fleet.store import Accepted, Batch, IngestResult, Refused, Store, StoreError
from bridge.infra import tracing

log = logging.getLogger("bridge.fleet.ingest")


@dataclass(frozen=True, slots=True)
class SourceHealth:
    ok: bool
    detail: str


class Source(Protocol):
    """One configured ingest source (`[[fleet.sources]]`)."""

    name: str

    async def start(self, ingestor: Ingestor) -> None:
        """Begin consuming (a bus source starts its task here and returns)."""

    async def stop(self) -> None:
        """Stop consuming; what was committed stays, what was not is redelivered."""

    def health(self) -> SourceHealth: ...


def classify(bodies: Iterable[bytes]) -> tuple[list[Accepted], list[tuple[int, Refused]]]:
    """Each body as a valid event, or refused with the contract's or the fleet's bounds'
    reason (and its index): every source's bodies pass here (`bridge.fleet.bounds`)."""
    accepted: list[Accepted] = []
    refused: list[tuple[int, Refused]] = []
    for index, body in enumerate(bodies):
        try:
            accepted.append(Accepted(bounds.event(body), body))
        except contract.ContractError as exc:
            refused.append((index, Refused(body, str(exc))))
    return accepted, refused


class Ingestor:
    """Commits what sources receive (see the module docstring); one per service."""

    def __init__(
        self,
        store: Store,
        stats: IngestStats,
        clock: Callable[[], float] = time.time,
        group: GroupCommit | None = None,
    ) -> None:
        self.store = store
        self.stats = stats
        self._clock = clock
        #: Where `commit(grouped=True)` goes: many requests' batches in one transaction.
        self.group = group or GroupCommit(store)

    async def commit(
        self,
        source: str,
        accepted: Sequence[Accepted],
        refused: Sequence[Refused] = (),
        checkpoints: Mapping[str, str] | None = None,
        *,
        grouped: bool = False,
        attested: bool | None = None,
    ) -> IngestResult:
        """Commit and count; `grouped` (the http source's posts) shares a transaction with
        other requests' batches (`bridge.fleet.group_commit`) and may raise `Overloaded`;
        `attested` is what the source's identity gate found (`Batch.attested`)."""
        batch = Batch(
            ingest=source,
            received_at=self._clock(),
            accepted=accepted,
            refused=refused,
            checkpoints=dict(checkpoints or {}),
            attested=attested,
        )
        try:
            try:
                result = await (self.group.commit(batch) if grouped else self.store.ingest(batch))
            except (StoreError, Overloaded):
                raise
            except Exception as exc:  # one event the store cannot hold must not stall the rest
                log.error(
                    "source %s: the store refused the batch, committing it event by event: %s",
                    source,
                    exc,
                )
                result = await self._one_by_one(batch)
        except StoreError as exc:
            self.stats.failed(batch.received_at, str(exc))
            raise
        self.stats.record(source, result)
        # Spans (bridge/infra/tracing.py); a grouped batch's commit is group_commit's span.
        for span in ("ingest",) if grouped else ("ingest", "commit"):
            traced = ((a.event.traceparent, a.event.id) for a in accepted)
            tracing.record(span, traced, batch.received_at, {"maintenance_bridge.ingest": source})
        return result

    async def _one_by_one(self, batch: Batch) -> IngestResult:
        """`batch` committed one event at a time; an event the store refuses (`UnstorableError`
        or anything but `StoreError`) is recorded as refused with the reason, and the
        refused ones and the checkpoints commit last, so a source resumes after all of them."""
        accepted = duplicate = 0
        lags: list[float] = []
        refused = list(batch.refused)
        for item in batch.accepted:
            try:
                one = await self.store.ingest(
                    replace(batch, accepted=[item], refused=(), checkpoints={})
                )
            except StoreError:
                raise
            except Exception as exc:
                refused.append(Refused(item.body, f"the fleet store cannot keep this event: {exc}"))
                continue
            accepted, duplicate = accepted + one.accepted, duplicate + one.duplicate
            lags.extend(one.lags)
        rest = await self.store.ingest(replace(batch, accepted=(), refused=refused))
        return IngestResult(accepted, duplicate, rest.invalid, tuple(lags))
