"""The `eventhubs` source: one consumer group over every partition of a hub, checkpoints in
the fleet store (no Blob storage account).

The official async consumer (`EventHubConsumerClient.receive_batch`, no checkpoint store)
reads all partitions of the hub in a process of its own (`bridge.fleet.sources.
eventhubs_receiver`: the SDK's pure-Python AMQP cost more CPU per event than the store, in
the fleet's process). Each batch it hands over (one partition's events, as their
structured JSON) is checked here on the thread that reads the pipe and queued, and one task
commits what the partitions queued in ONE store transaction together with each partition's
checkpoint `partition -> sequence number of its last event`, so the store never holds
events without the position they reach, nor a position past events it does not hold. The
SDK hands over what its buffer holds at the moment (a few dozen events while draining a
backlog), so one transaction per hand-over made small transactions; the queue gathers up
to `batch_size` events (waiting `batch_wait` for more), and a partition's callback waits
for the commit once `batch_size` events are handed over and not yet taken for a commit
(memory stays bounded). A reconnect or a partition closing first waits for what is queued to
commit. After a restart the source reads those checkpoints and starts each partition just
after its own (`starting_position_inclusive` false): no gap and no double; partitions never
checkpointed start at `start` (the oldest retained event by default). Replicas sharing a
PostgreSQL store may all read the hub: the store's (source, id) key turns the second copy
of every event into a duplicate; with `share_partitions` they split the partitions, the
ownership kept in the store (`bridge.fleet.sources.eventhubs_ownership`, answered here for
the receiver's load balancer).

While the store cannot commit, the batch is retried with backoff and the partitions wait
(their checkpoints do not move). Content modes of the CloudEvents AMQP binding, as the
sidecars' Event Hubs sink sends them: structured (`application/cloudevents+json`, the body
kept as received) and binary (`cloudEvents_*` application properties: `event_body` writes the
JSON the CloudEvents SDK binding would, without an SDK object per event). Anything else, or
an invalid event, is refused into the rejected table and its position is checkpointed with
the batch, so it cannot loop. With `identity` set, the
`bridgecredential` application property is screened (`bridge.fleet.sources.bus`): a refused
message goes to the rejected table and is checkpointed past too.

The receiver process is started with the source and stopped with it; if it fails (the hub
unreachable, refused credentials) or ends, it is started again after `retry_max` seconds
from the checkpoints in the store. If the fleet's process is killed, the receiver sees its
pipe close and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bridge.fleet.bus_config import EventHubsSourceConfig
from bridge.fleet.identity.gate import IdentityGate
from bridge.fleet.sources.base import Ingestor, SourceHealth
from bridge.fleet.sources.bus import Committer, Decoded, check
from bridge.fleet.sources.eventhubs_receiver import (
    ENCODER,
    FROM_RECEIVER,
    Call,
    Channel,
    Closed,
    Done,
    Failed,
    Handed,
    Item,
    Logged,
    Opened,
    Receiving,
    Reply,
    Start,
    Stop,
    Taken,
    ToFleet,
    ToReceiver,
    run,
)
from bridge.fleet.store import Refused

if TYPE_CHECKING:
    from multiprocessing.context import SpawnProcess

    from bridge.fleet.sources.eventhubs_ownership import StoreOwnership

log = logging.getLogger("bridge.fleet.eventhubs")

#: Seconds `stop` waits for the receiver to close its consumer before killing it.
STOP_TIMEOUT = 30.0


class EventHubsSource:
    """`[[fleet.sources]] type = "eventhubs"` (see the module docstring)."""

    def __init__(self, config: EventHubsSourceConfig, identity: IdentityGate | None = None) -> None:
        self.name = config.name
        self._config = config
        self.identity = identity
        self._task: asyncio.Task[None] | None = None
        self._committer: Committer | None = None
        self._ownership: StoreOwnership | None = None
        self._partitions: set[str] = set()
        self._error: str | None = "not started"
        self._flusher: asyncio.Task[None] | None = None
        self._process: SpawnProcess | None = None
        self._connection: Channel | None = None
        self._reader: threading.Thread | None = None
        #: Set when the receiver reports a failure (its reason) or its process ended (None).
        self._ended: asyncio.Future[str | None] | None = None
        self._calls: set[asyncio.Task[None]] = set()
        #: Hand-overs waiting for the next commit, the events they hold, those committing.
        self._queue: list[_Queued] = []
        self._queued = 0
        self._flushing: list[_Queued] = []
        self._arrived = asyncio.Event()
        #: Settled when everything handed over up to now is committed (or failed).
        self._drained: list[tuple[int, asyncio.Future[None]]] = []
        #: Hand-overs queued and committed so far, counted here (a new receiver process
        #: numbers its own from 1 again).
        self._arrivals = 0
        self._settled = 0

    def __repr__(self) -> str:
        return f"EventHubsSource(name={self.name!r}, group={self._config.consumer_group!r})"

    @property
    def receiver_pid(self) -> int | None:
        """The receiver process's id (None while none runs): its CPU is not the fleet's."""
        process = self._process
        return process.pid if process is not None and process.is_alive() else None

    async def start(self, ingestor: Ingestor) -> None:
        self._committer = Committer(self.name, ingestor, self._config, self.identity)
        if self._config.share_partitions:
            from bridge.fleet.sources.eventhubs_ownership import StoreOwnership

            self._ownership = StoreOwnership(ingestor.store, self.name)
        self._task = asyncio.create_task(self._receive(ingestor), name=f"fleet-{self.name}")
        self._flusher = asyncio.create_task(
            self._flush(self._committer), name=f"fleet-{self.name}-commit"
        )

    async def stop(self) -> None:
        flusher, self._flusher = self._flusher, None
        if flusher is not None:
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)
        # Not committed: read again next time.
        self._queue, self._flushing, self._queued = [], [], 0
        self._settled = self._arrivals
        for _, drained in self._drained:
            drained.cancel()
        self._drained = []
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._end_receiver()
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

    # -- the receiver process ---------------------------------------------------------------

    async def _receive(self, ingestor: Ingestor) -> None:
        """Keep a receiver reading every partition until stopped. A start that fails (hub
        unreachable, refused credentials), a receive that ends with an error or a receiver
        process that ends is tried again after `retry_max` seconds, from the checkpoints in
        the store once what was handed over before is committed."""
        loop = asyncio.get_running_loop()
        while True:
            await self._committed()  # what an earlier receive handed over, before positions
            if self._connection is None:
                await self._start_receiver(loop)
            self._ended = loop.create_future()
            checkpoints = await ingestor.store.checkpoints(self.name)
            self._send(Start(dict(checkpoints)))
            reason = await self._ended
            if reason is None:
                reason = "the receiver process ended"
                await self._end_receiver()
            self._error = f"not consuming: {reason}"
            log.warning("source %s: %s; trying again", self.name, self._error)
            self._partitions.clear()
            await asyncio.sleep(self._config.retry_max)

    async def _start_receiver(self, loop: asyncio.AbstractEventLoop) -> None:
        """A receiver process (`spawn`: nothing of this process's threads or loop in it),
        and the thread that reads what it sends."""
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        process = context.Process(
            target=run, args=(theirs, self._config), name=f"fleet-{self.name}", daemon=True
        )
        await asyncio.to_thread(process.start)
        theirs.close()  # its end is the receiver's alone: it closes when the receiver ends
        self._process, self._connection = process, ours
        self._reader = threading.Thread(
            target=self._read, args=(ours, loop), name=f"fleet-{self.name}-pipe", daemon=True
        )
        self._reader.start()

    async def _end_receiver(self) -> None:
        """Ask the receiver to close its consumer (releasing its partitions through the
        store, which this process answers meanwhile), then make sure it is gone."""
        process, connection, reader = self._process, self._connection, self._reader
        self._send(Stop())
        if process is not None:
            await asyncio.to_thread(process.join, STOP_TIMEOUT)
            if process.is_alive():
                log.warning("source %s: the receiver did not stop; killing it", self.name)
                process.kill()
                await asyncio.to_thread(process.join, STOP_TIMEOUT)
            process.close()
        self._process = self._connection = self._reader = None
        if reader is not None:
            await asyncio.to_thread(reader.join, STOP_TIMEOUT)
        if connection is not None:
            connection.close()
        for call in list(self._calls):
            call.cancel()

    def _send(self, message: ToReceiver) -> None:
        connection = self._connection
        if connection is None:
            return
        try:
            connection.send_bytes(ENCODER.encode(message))
        except OSError as exc:  # the receiver is gone: the reader thread reports it
            log.debug("source %s: cannot reach the receiver: %s", self.name, exc)

    def _read(self, connection: Channel, loop: asyncio.AbstractEventLoop) -> None:
        """On a thread of its own: what the receiver sends, each batch checked here (off the
        event loop, while the store writes on its own thread), until the pipe closes."""
        screened = self.identity is not None and self.identity.mode != "off"
        while True:
            try:
                message: ToFleet = FROM_RECEIVER.decode(connection.recv_bytes())
            except (EOFError, OSError):
                break
            if isinstance(message, Handed):
                decoded = [_decoded(item, screened) for item in message.items]
                loop.call_soon_threadsafe(self._arrive, message, decoded)
            else:
                loop.call_soon_threadsafe(self._on_message, message)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to tell
            loop.call_soon_threadsafe(self._on_end, connection)

    def _on_end(self, connection: Channel) -> None:
        ended = self._ended
        if connection is self._connection and ended is not None and not ended.done():
            ended.set_result(None)

    def _on_message(self, message: ToFleet) -> None:
        if isinstance(message, Opened):
            self._partitions.add(message.partition)
        elif isinstance(message, Closed):
            self._partitions.discard(message.partition)
        elif isinstance(message, Receiving):
            self._error = None
        elif isinstance(message, Failed):
            if self._ended is not None and not self._ended.done():
                self._ended.set_result(message.reason)
        elif isinstance(message, Call):
            call = asyncio.create_task(self._answer(message))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)
        elif isinstance(message, Logged):
            logging.getLogger(message.logger).log(message.level, "%s", message.message)

    async def _answer(self, call: Call) -> None:
        """A call of the receiver's load balancer, answered with the store's ownership."""
        try:
            assert self._ownership is not None, "partitions are not shared"
            result = await getattr(self._ownership, call.method)(*call.arguments)
            reply = Reply(call.number, list(result) if result is not None else None)
        except Exception as exc:
            reply = Reply(call.number, error=f"{type(exc).__name__}: {exc}")
        self._send(reply)

    # -- committing -------------------------------------------------------------------------

    def _arrive(self, handed: Handed, messages: list[Decoded]) -> None:
        if self._committer is None or self._flusher is None:
            return
        self._arrivals += 1
        queued = _Queued(messages, handed.partition, handed.position, handed.number, self._arrivals)
        self._queue.append(queued)
        self._queued += len(messages)
        self._arrived.set()

    async def _flush(self, committer: Committer) -> None:
        """Commit what the partitions queued, `batch_size` events or what came within
        `batch_wait`, in one transaction with each partition's last position, then tell the
        receiver how far it is committed."""
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
            self._send(Taken(taken[-1].number))
            checkpoints = {q.partition: q.position for q in taken}  # each one's last
            messages = [message for q in taken for message in q.messages]
            error: str | None = None
            try:
                await committer.commit(messages, checkpoints)
            except Exception as exc:  # not StoreError (retried): a bug; the receiver sees it
                log.exception("source %s: cannot commit a batch", self.name)
                error = f"{type(exc).__name__}: {exc}"
            finally:
                self._flushing = []
            self._send(Done(taken[-1].number, error))
            self._settle(taken[-1].arrival)

    def _settle(self, arrival: int) -> None:
        """Hand-overs up to `arrival` (this process's count) are committed or failed."""
        self._settled = arrival
        still = []
        for upto, drained in self._drained:
            if upto <= arrival:
                if not drained.done():
                    drained.set_result(None)
            else:
                still.append((upto, drained))
        self._drained = still

    async def _committed(self) -> None:
        """Wait until what is queued now has been committed (or failed)."""
        if self._arrivals <= self._settled:
            return
        drained = asyncio.get_running_loop().create_future()
        self._drained.append((self._arrivals, drained))
        self._arrived.set()
        await asyncio.wait([drained])  # `stop` cancels it: nothing more will commit


@dataclass(slots=True)
class _Queued:
    """One partition's hand-over waiting for its commit."""

    messages: list[Decoded]
    partition: str
    position: str
    #: The receiver's number for it (`Done`), and this process's count of hand-overs.
    number: int
    arrival: int


def _decoded(item: Item, screened: bool) -> Decoded:
    """A handed-over message, checked (`screened`: its credential and time kept for the
    identity gate)."""
    body, credential, taken, reason = item
    if reason is not None:
        return Decoded(None, Refused(body, reason))
    if not screened:
        credential = taken = None
    return Decoded(body, None, credential, taken, check(body))
