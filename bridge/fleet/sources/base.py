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

A `commit` that raises `StoreError` has written nothing: the source must not ack and should
retry with backoff (`bridge.infra.backoff`), keeping its transport's redelivery as the safety net.
`health()` is what `/readyz` shows for the source; it should turn false when the source
stops consuming (stream broken, consumer not assigned), not on a single transient error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from bridge import contract
from bridge.fleet.group_commit import GroupCommit
from bridge.fleet.metrics import IngestStats
from bridge.fleet.store import Accepted, Batch, IngestResult, Refused, Store


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
    """Each body as a valid event, or refused with the contract's reason (and its index)."""
    accepted: list[Accepted] = []
    refused: list[tuple[int, Refused]] = []
    for index, body in enumerate(bodies):
        try:
            accepted.append(Accepted(contract.from_cloudevent(body), body))
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
    ) -> IngestResult:
        """Commit and count; `grouped` (the http source's posts) shares a transaction with
        other requests' batches (`bridge.fleet.group_commit`) and may raise `Overloaded`."""
        batch = Batch(
            ingest=source,
            received_at=self._clock(),
            accepted=accepted,
            refused=refused,
            checkpoints=dict(checkpoints or {}),
        )
        result = await (self.group.commit(batch) if grouped else self.store.ingest(batch))
        self.stats.record(source, result)
        return result
