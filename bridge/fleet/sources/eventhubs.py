"""The `eventhubs` source: one consumer group over every partition of a hub, checkpoints in
the fleet store (no Blob storage account).

The official async consumer (`EventHubConsumerClient.receive_batch`, no checkpoint store)
reads all partitions of the hub. Each batch it hands over (one partition's events) is
queued, and one task commits what the partitions queued in ONE store transaction together
with each partition's checkpoint `partition -> sequence number of its last event`, so the
store never holds events without the position they reach, nor a position past events it
does not hold. The SDK hands over what its buffer holds at the moment (a few dozen events
while draining a backlog), so one transaction per hand-over made small transactions; the
queue gathers up to `batch_size` events (waiting `batch_wait` for more), and a partition's
callback waits for the commit only once `batch_size` events are queued (memory stays
bounded). A reconnect or a partition closing first waits for what is queued to commit.
After a restart the source reads those checkpoints and starts each partition just after
its own (`starting_position_inclusive` false): no gap and no double; partitions never
checkpointed start at `start` (the oldest retained event by default). Replicas sharing a
PostgreSQL store may all read the hub: the store's (source, id) key turns the second copy
of every event into a duplicate.

While the store cannot commit, the batch is retried with backoff and the partitions wait
(their checkpoints do not move). Content modes of the CloudEvents AMQP binding, as the
sidecars' Event Hubs sink sends them: structured (`application/cloudevents+json`, the body
kept as received) and binary (`cloudEvents_*` application properties: `event_body` writes the
JSON the CloudEvents SDK binding would, without an SDK object per event). Anything else, or
an invalid event, is refused into the rejected table and its position is checkpointed with
the batch, so it cannot loop. With `identity` set, the
`bridgecredential` application property is screened (`bridge.fleet.sources.bus`): a refused
message goes to the rejected table and is checkpointed past too.

`azure.eventhub` (and `azure.identity` for Azure AD) are imported when the source starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from bridge.fleet.bus_config import EventHubsSourceConfig
from bridge.fleet.identity.gate import IdentityGate
from bridge.fleet.sources.base import Ingestor, SourceHealth
from bridge.fleet.sources.bus import Committer, Decoded, decode
from bridge.transports.eventhubs import event_body, event_credential, open_client

log = logging.getLogger("bridge.fleet.eventhubs")

_STARTS = {"earliest": "-1", "latest": "@latest"}
#: Events each partition's link asks ahead (its credit), in batches: the SDK's default of
#: 300 with a pause of 50 ms between its reads capped a partition near 6,000 events/s, and a
#: batch larger than the credit could never fill.
PREFETCH_BATCHES = 2


class EventHubsSource:
    """`[[fleet.sources]] type = "eventhubs"` (see the module docstring)."""

    def __init__(self, config: EventHubsSourceConfig, identity: IdentityGate | None = None) -> None:
        self.name = config.name
        self._config = config
        self.identity = identity
        self._client: Any = None
        self._credential: Any = None
        self._task: asyncio.Task[None] | None = None
        self._committer: Committer | None = None
        self._partitions: set[str] = set()
        self._error: str | None = "not started"
        self._flusher: asyncio.Task[None] | None = None
        #: Hand-overs waiting for the next commit, the events they hold, those committing.
        self._queue: list[_Queued] = []
        self._queued = 0
        self._flushing: list[_Queued] = []
        self._arrived = asyncio.Event()

    def __repr__(self) -> str:
        return f"EventHubsSource(name={self.name!r}, group={self._config.consumer_group!r})"

    def _make_client(self, ingestor: Ingestor) -> Any:
        from azure.eventhub.aio import EventHubConsumerClient

        config = self._config
        sharing: dict[str, Any] = {}
        if config.share_partitions:
            from bridge.fleet.sources.eventhubs_ownership import StoreOwnership

            sharing = {
                "checkpoint_store": StoreOwnership(ingestor.store, self.name),
                "load_balancing_interval": config.load_balancing_interval,
            }
        client, self._credential = open_client(
            EventHubConsumerClient, config, consumer_group=config.consumer_group, **sharing
        )
        return client

    async def start(self, ingestor: Ingestor) -> None:
        self._committer = Committer(self.name, ingestor, self._config, self.identity)
        self._client = self._make_client(ingestor)
        self._task = asyncio.create_task(self._receive(ingestor), name=f"fleet-{self.name}")
        self._flusher = asyncio.create_task(
            self._flush(self._committer), name=f"fleet-{self.name}-commit"
        )

    async def stop(self) -> None:
        flusher, self._flusher = self._flusher, None
        if flusher is not None:
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)
        for queued in self._queue + self._flushing:  # not committed: read again next time
            queued.done.cancel()
        self._queue, self._flushing, self._queued = [], [], 0
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
            self._client = None
        if self._credential is not None:
            with contextlib.suppress(Exception):
                await self._credential.close()
            self._credential = None
        self._partitions.clear()
        self._error = "stopped"

    def health(self) -> SourceHealth:
        committer = self._committer
        if self._error is not None:
            return SourceHealth(False, self._error)
        if not self._partitions:
            return SourceHealth(False, "no partition is being read yet")
        if committer is not None and committer.failing is not None:
            return SourceHealth(False, f"cannot commit: {committer.failing}")
        committed = committer.committed if committer is not None else 0
        parts = ",".join(sorted(self._partitions, key=lambda p: (len(p), p)))
        return SourceHealth(True, f"partitions {parts}: {committed} event(s)")

    async def _positions(self, ingestor: Ingestor) -> dict[str, Any]:
        """Where each partition starts: after its checkpoint, else at `start`."""
        checkpoints = await ingestor.store.checkpoints(self.name)
        default = _STARTS[self._config.start]
        partitions = await self._client.get_partition_ids()
        return {pid: int(checkpoints[pid]) if pid in checkpoints else default for pid in partitions}

    async def _receive(self, ingestor: Ingestor) -> None:
        """Read every partition until stopped. A start that fails (hub unreachable, refused
        credentials) or a receive that ends with an error is tried again with a new client,
        from the checkpoints in the store, after `retry_max` seconds."""
        while True:
            try:
                await self._committed()  # what an earlier client queued, before its positions
                positions = await self._positions(ingestor)
                self._error = None
                log.info("source %s: starting at %s", self.name, positions)
                await self._client.receive_batch(
                    self._on_batch,
                    max_batch_size=self._config.batch_size,
                    prefetch=self._config.batch_size * PREFETCH_BATCHES,
                    starting_position=positions,
                    starting_position_inclusive=False,
                    on_error=self._on_error,
                    on_partition_initialize=self._on_open,
                    on_partition_close=self._on_close,
                )
                return  # the client was closed: the source is stopping
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._error = f"not consuming: {type(exc).__name__}: {exc}"
                log.warning("source %s: %s; trying again", self.name, self._error)
            self._partitions.clear()
            with contextlib.suppress(Exception):
                await self._client.close()
            await asyncio.sleep(self._config.retry_max)
            self._client = self._make_client(ingestor)

    async def _on_batch(self, context: Any, events: list[Any]) -> None:
        if not events or self._committer is None:
            return
        queued = _Queued(
            [_decoded(data) for data in events],
            context.partition_id,
            str(events[-1].sequence_number),
            asyncio.get_running_loop().create_future(),
        )
        self._queue.append(queued)
        self._queued += len(queued.messages)
        self._arrived.set()
        if self._queued >= self._config.batch_size:
            await asyncio.shield(queued.done)  # back-pressure: wait for the commit

    async def _flush(self, committer: Committer) -> None:
        """Commit what the partitions queued, `batch_size` events or what came within
        `batch_wait`, in one transaction with each partition's last position."""
        loop = asyncio.get_running_loop()
        config = self._config
        while True:
            await self._arrived.wait()
            deadline = loop.time() + config.batch_wait
            while self._queued < config.batch_size and (left := deadline - loop.time()) > 0:
                self._arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), left)
            self._arrived.clear()
            taken, self._queue, self._queued = self._queue, [], 0
            if not taken:
                continue
            self._flushing = taken
            checkpoints = {q.partition: q.position for q in taken}  # each one's last
            messages = [message for q in taken for message in q.messages]
            try:
                await committer.commit(messages, checkpoints)
            except Exception as exc:  # not StoreError (retried): a bug; the callbacks see it
                for q in taken:
                    if not q.done.done():
                        q.done.set_exception(exc)
                continue
            finally:
                self._flushing = []
            for q in taken:
                if not q.done.done():
                    q.done.set_result(None)

    async def _committed(self) -> None:
        """Wait until what is queued now has been committed (or failed)."""
        waiting = [q.done for q in self._queue + self._flushing]
        if waiting:
            self._arrived.set()
            await asyncio.gather(*(asyncio.shield(w) for w in waiting), return_exceptions=True)

    async def _on_open(self, context: Any) -> None:
        self._partitions.add(context.partition_id)

    async def _on_close(self, context: Any, _reason: Any) -> None:
        self._partitions.discard(context.partition_id)
        await self._committed()  # its checkpoint in the store before another reader starts

    async def _on_error(self, context: Any, error: Exception) -> None:
        where = f"partition {context.partition_id}" if context is not None else "the client"
        log.warning("source %s: %s: %s: %s", self.name, where, type(error).__name__, error)


@dataclass(slots=True)
class _Queued:
    """One partition's hand-over waiting for its commit."""

    messages: list[Decoded]
    partition: str
    position: str
    done: asyncio.Future[None]


def _decoded(data: Any) -> Decoded:
    # enqueued_time: set by Event Hubs when it took the message
    return decode(
        b"".join(data.body), lambda: event_body(data), event_credential(data), data.enqueued_time
    )
