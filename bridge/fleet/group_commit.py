"""Group commit: the events of many concurrent requests in one store transaction.

Each sidecar posts its own events, one per request, many at once. One transaction (and one
fsync) per request caps a SQLite or PostgreSQL store at a few thousand requests a second;
a database gets past that the way it does for its own log, by committing many requests'
work at once and answering each after that commit (what PostgreSQL's `commit_delay` and
InnoDB's group commit do).

`GroupCommit.commit(batch)` queues the batch and waits. One flusher task takes what is
queued, up to `max_events` events (a batch larger than that goes alone), waiting at most
`max_wait` seconds for company when only one request is queued, and hands them to
`Store.ingest_many`, which applies them in order in ONE transaction. Every waiting request
is answered after that transaction committed, with its own counts, so a 2xx still means
durable; when the transaction fails because the store cannot commit (`StoreError`), every
request in it gets that error (the HTTP source answers each with 503 and Retry-After;
nothing of any of them was written). When it fails for what one batch holds (any other
error: an event the store cannot hold), the group is committed again one batch at a time,
so one bad request never fails the others; it gets its own error.

While a transaction runs the next requests queue, so under load the groups grow by
themselves; `max_wait` only matters when the store is idle (a lone request queued). The
queue is bounded: `max_queued` events waiting at most; past it `commit` raises `Overloaded`
at once (HTTP: 503 with Retry-After) instead of holding the request's memory -
back-pressure during a burst, never an unbounded queue.

Requests are bounded before they reach the queue too: `admit` lets at most `max_requests`
be handled at once (read, verified, parsed, queued, answered) and raises `Overloaded` past
that, before anything of the request is read. A burst of 50,000 VMs posting at once then
costs the service what `max_requests` posts cost - their buffers, and the event loop's turns
(the API's reads share that loop: behind thousands of posts each read would wait its turn
through all of them) - and the other senders retry after `Retry-After`. A few hundred
requests in flight keep the groups as large as the store commits anyway, so throughput
does not suffer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Final

from bridge.fleet.metrics import GroupStats
from bridge.fleet.store import Batch, IngestResult, Store, StoreError
from bridge.infra import tracing

log = logging.getLogger("bridge.fleet.group_commit")

#: Seconds a sender should wait after `Overloaded` (the webhook sink honours Retry-After).
RETRY_AFTER: Final = 1


class Overloaded(Exception):
    """The ingest queue is full, or `max_requests` are being handled: the sender retries
    after `retry_after` seconds."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason}; retry")
        self.retry_after = RETRY_AFTER


@dataclass(slots=True)
class _Waiting:
    batch: Batch
    size: int
    answer: asyncio.Future[IngestResult]


class GroupCommit:
    """Queues batches and commits them in groups (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        *,
        max_events: int = 500,
        max_wait: float = 0.002,
        max_queued: int = 20_000,
        max_requests: int = 256,
        stats: GroupStats | None = None,
    ) -> None:
        self.store = store
        self.max_events = max_events
        self.max_wait = max_wait
        self.max_queued = max_queued
        self.max_requests = max_requests
        #: Requests admitted and not answered yet (`admit`, `leave`).
        self.handling = 0
        self._queue: deque[_Waiting] = deque()
        self.queued = 0
        self._arrived = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        #: Transactions committed and batches they held (`/metrics`, tests).
        self.stats = stats or GroupStats()

    @property
    def transactions(self) -> int:
        return self.stats.transactions

    @property
    def batches(self) -> int:
        return self.stats.batches

    def admit(self) -> None:
        """Count one more request being handled; `Overloaded` when `max_requests` are. Each
        admitted request calls `leave` once answered."""
        if self.handling >= self.max_requests:
            raise Overloaded(
                f"{self.handling} ingest requests are being handled (at most {self.max_requests})"
            )
        self.handling += 1

    def leave(self) -> None:
        self.handling -= 1

    @staticmethod
    def _size(batch: Batch) -> int:
        return max(1, len(batch.accepted) + len(batch.refused))

    async def commit(self, batch: Batch) -> IngestResult:
        """The batch's counts once the transaction holding it committed; `StoreError` when
        it failed, `Overloaded` at once when the queue is full."""
        size = self._size(batch)
        if self.queued + size > self.max_queued and self.queued > 0:
            raise Overloaded(
                f"{self.queued} events are waiting for the store (at most {self.max_queued})"
            )
        waiting = _Waiting(batch, size, asyncio.get_running_loop().create_future())
        self._queue.append(waiting)
        self.queued += size
        self._arrived.set()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="fleet-group-commit")
        return await waiting.answer

    async def close(self) -> None:
        """Stop the flusher after what is queued was committed (the service's stop)."""
        while self._queue and self._flusher is not None and not self._flusher.done():
            await asyncio.sleep(0)
            await asyncio.wait([self._flusher], timeout=0.05)
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        for waiting in self._queue:
            if not waiting.answer.done():
                waiting.answer.set_exception(StoreError("the fleet service is stopping"))
        self._queue.clear()
        self.queued = 0

    def _take(self) -> list[_Waiting]:
        """The next group: queued batches in order, up to `max_events` events (one batch at
        least, however large)."""
        group = [self._queue.popleft()]
        events = group[0].size
        while self._queue and events + self._queue[0].size <= self.max_events:
            waiting = self._queue.popleft()
            group.append(waiting)
            events += waiting.size
        return group

    async def _flush(self) -> None:
        while self._queue:
            if len(self._queue) == 1 and self.max_wait > 0:
                # A lone request on an idle store: give concurrent ones a moment to join.
                # (Under load, those that arrived during the last commit are queued already:
                # taking them at once is the group, and waiting would only add latency.)
                self._arrived.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.max_wait):
                        while self.queued < self.max_events:
                            await self._arrived.wait()
                            self._arrived.clear()
            group = self._take()
            began = time.time()
            try:
                results = await self.store.ingest_many([w.batch for w in group])
            except StoreError as exc:  # the store cannot commit: every request gets it
                for waiting in group:
                    self._answer(waiting, exc)
            except Exception as exc:  # what one batch holds: split the group
                if len(group) == 1:
                    self._answer(group[0], exc)
                    continue
                log.warning("group commit of %d batches failed, one by one: %s", len(group), exc)
                for waiting in group:
                    await self._alone(waiting)
            else:
                self.stats.transactions += 1
                self.stats.batches += len(group)
                _traced(group, began)
                for waiting, result in zip(group, results, strict=True):
                    self._answer(waiting, result)

    async def _alone(self, waiting: _Waiting) -> None:
        """Commit one batch of a group that failed for something other than the store (an
        event it cannot hold): the others of the group commit, this one gets its own error
        (the caller handles it as if it had committed alone)."""
        try:
            (result,) = await self.store.ingest_many([waiting.batch])
        except Exception as exc:  # handed to the request that sent it
            self._answer(waiting, exc)
        else:
            self.stats.transactions += 1
            self.stats.batches += 1
            self._answer(waiting, result)

    def _answer(self, waiting: _Waiting, outcome: IngestResult | Exception) -> None:
        self.queued -= waiting.size
        if waiting.answer.done():  # the request went away (client closed): nothing to say
            return
        if isinstance(outcome, Exception):
            waiting.answer.set_exception(outcome)
        else:
            waiting.answer.set_result(outcome)


def _traced(group: list[_Waiting], began: float) -> None:
    """One `commit` span per event of the transaction (bridge/infra/tracing.py)."""
    traced = ((a.event.traceparent, a.event.id) for w in group for a in w.batch.accepted)
    tracing.record("commit", traced, began, {"maintenance_bridge.batches": len(group)})
