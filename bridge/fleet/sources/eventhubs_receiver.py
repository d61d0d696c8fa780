"""The `eventhubs` source's receiver: the official consumer in a process of its own.

The Azure SDK speaks AMQP in pure Python (its `pyamqp`): framing, decoding and one
`EventData` per message cost about 100 us of CPU per event, more than the fleet's store
spends on it. In the fleet's process that work competed for the GIL with the store's writer
and the API. So the consumer runs here, in a process started with `spawn` (no inherited
threads or event loop), and hands over each partition's batch as bytes: the event's
structured JSON (converted here, `event_body`), its credential and the time Event Hubs took
it, or the raw message and why it cannot be an event. The fleet's process checks the bodies
(it needs their typed values) and commits them as before (`bridge.fleet.sources.eventhubs`).

What stays where it was:

- Checkpoints commit with their events in the fleet's store; this process never writes one.
  It is told where each partition starts (`Start`, the store's checkpoints), and a batch's
  position goes to the fleet with the batch.
- Back-pressure, as when the consumer ran in the fleet's process: a partition's callback
  waits for the commit of its own hand-over once `batch_size` events are handed over and
  not yet taken for a commit (`Taken`; a batch commits meanwhile), or until fewer wait
  again, and a partition that closes first waits for everything handed over (`Done` says
  how far the fleet committed). Counting the batch being committed too would stall: every
  partition waiting on the next batch, which would wait `batch_wait` for more events that
  could not come.
- Partition ownership (`share_partitions`): the SDK's load balancer runs here, its
  checkpoint store a proxy (`_Ownership`) whose calls the fleet's process answers with
  `StoreOwnership` on its store (`Call` / `Reply`).
- kill -9 of the fleet: this process reads the pipe on a thread and exits at once when it
  ends (nothing to hand over to); its ownership lapses like the fleet's would. A receiver
  that ends on its own is started again by the fleet, from the store's checkpoints.

The messages on the pipe are msgspec structs, one tagged union, as MessagePack.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Final, Protocol

import msgspec

from bridge.fleet.bus_config import EventHubsSourceConfig
from bridge.fleet.sources.converting import converted
from bridge.transports.eventhubs import event_body, event_credential


class Channel(Protocol):
    """One end of `multiprocessing.Pipe` (a `Connection` on POSIX, a `PipeConnection` on
    Windows): what the fleet and its receiver use of it, the same on each platform."""

    def send_bytes(self, buf: bytes, /) -> None: ...

    def recv_bytes(self) -> bytes: ...

    def send(self, obj: Any, /) -> None: ...

    def recv(self) -> Any: ...

    def poll(self, timeout: float | None = 0.0, /) -> bool: ...

    def close(self) -> None: ...


log = logging.getLogger("bridge.fleet.eventhubs")

_STARTS: Final = {"earliest": "-1", "latest": "@latest"}
#: Events each partition's link asks ahead (its credit), in batches: the SDK's default of
#: 300 with a pause of 50 ms between its reads capped a partition near 6,000 events/s, and a
#: batch larger than the credit could never fill.
PREFETCH_BATCHES: Final = 2

#: One message as handed over: (body, credential, enqueued at (Unix s), None) for a message
#: converted to its event's structured JSON; (raw message, None, None, reason) for one that
#: cannot be an event.
Item = tuple[bytes, str | None, float | None, str | None]


# -- the receiver's messages to the fleet ---------------------------------------------------


class Handed(msgspec.Struct, array_like=True, tag=1):
    """One partition's batch; `number` counts hand-overs from 1 (`Done` refers to it)."""

    number: int
    partition: str
    position: str
    items: list[Item]


class Receiving(msgspec.Struct, array_like=True, tag=2):
    """The hub answered: the partitions are being read from the positions given."""


class Opened(msgspec.Struct, array_like=True, tag=3):
    partition: str


class Closed(msgspec.Struct, array_like=True, tag=4):
    partition: str


class Failed(msgspec.Struct, array_like=True, tag=5):
    """The consumer stopped with `reason`; the receiver waits for the next `Start`."""

    reason: str


class Call(msgspec.Struct, array_like=True, tag=6):
    """A call of the SDK's checkpoint store, for `StoreOwnership` in the fleet."""

    number: int
    method: str
    arguments: list[Any]


class Logged(msgspec.Struct, array_like=True, tag=7):
    logger: str
    level: int
    message: str


# -- the fleet's messages to the receiver ---------------------------------------------------


class Start(msgspec.Struct, array_like=True, tag=11):
    """Read every partition, each after its checkpoint (`checkpoints`) or at the source's
    configured start."""

    checkpoints: dict[str, str]


class Done(msgspec.Struct, array_like=True, tag=12):
    """Hand-overs up to `number` are committed (`error`: none of them could be, a bug)."""

    number: int
    error: str | None = None


class Reply(msgspec.Struct, array_like=True, tag=13):
    number: int
    result: Any = None
    error: str | None = None


class Stop(msgspec.Struct, array_like=True, tag=14):
    """Close the consumer (releasing its partitions) and exit."""


class Taken(msgspec.Struct, array_like=True, tag=15):
    """Hand-overs up to `number` are being committed (no longer waiting in the fleet)."""

    number: int


ToFleet = Handed | Receiving | Opened | Closed | Failed | Call | Logged
ToReceiver = Start | Done | Reply | Stop | Taken
ENCODER: Final = msgspec.msgpack.Encoder()
FROM_RECEIVER: Final = msgspec.msgpack.Decoder(ToFleet)
_FROM_FLEET: Final = msgspec.msgpack.Decoder(ToReceiver)


def item(data: Any) -> Item:
    """One received `EventData` as handed to the fleet (see `Item`)."""
    raw = b"".join(data.body)
    body = converted(lambda: event_body(data))
    if isinstance(body, str):
        return (raw, None, None, body)
    taken = data.enqueued_time  # set by Event Hubs when it took the message
    return (body, event_credential(data), taken.timestamp() if taken else None, None)


def run(connection: Channel, config: EventHubsSourceConfig) -> None:
    """The receiver process's target: serve the fleet on `connection` until told to stop
    or the fleet is gone."""
    outbox = _Outbox(connection)
    logging.basicConfig(level=logging.WARNING, handlers=[_Forward(outbox)], force=True)
    logging.getLogger("bridge").setLevel(logging.INFO)

    async def serve() -> None:
        await _Receiver(connection, outbox, config).serve()

    try:
        asyncio.run(serve())
    finally:
        outbox.close()


class _Outbox:
    """Messages to the fleet, written to the pipe by a thread of their own: a write blocks
    while the fleet checks the batch before (the pipe holds 64 KiB), and the event loop
    must go on receiving meanwhile (how many are in flight is bounded by `Done`)."""

    def __init__(self, connection: Channel) -> None:
        self._connection = connection
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._write, name="eventhubs-outbox", daemon=True)
        self._thread.start()

    def put(self, message: ToFleet) -> None:
        self._queue.put(ENCODER.encode(message))

    def close(self) -> None:
        """Write what is queued, then stop."""
        self._queue.put(None)
        self._thread.join()

    def _write(self) -> None:
        while (encoded := self._queue.get()) is not None:
            try:
                self._connection.send_bytes(encoded)
            except OSError:
                return  # the fleet is gone: the reader thread exits the process


class _Forward(logging.Handler):
    """Log records go to the fleet's process, which logs them with its own configuration."""

    def __init__(self, outbox: _Outbox) -> None:
        super().__init__()
        self._outbox = outbox

    def emit(self, record: logging.LogRecord) -> None:
        self._outbox.put(Logged(record.name, record.levelno, self.format(record)))


class _Receiver:
    def __init__(self, connection: Channel, outbox: _Outbox, config: EventHubsSourceConfig) -> None:
        self._connection = connection
        self.send = outbox.put
        self._config = config
        self._loop = asyncio.get_running_loop()
        self._commands: asyncio.Queue[ToReceiver] = asyncio.Queue()
        self._handed = 0
        #: Hand-overs not yet committed: number -> (events, settled when committed).
        self._waiting: dict[int, asyncio.Future[None]] = {}
        #: Hand-overs the fleet has not taken for a commit yet: number -> events, and the sum.
        self._untaken: dict[int, int] = {}
        self._queued = 0
        #: Settled when `_queued` falls below `batch_size` again (partitions waiting for it).
        self._room: asyncio.Future[None] | None = None
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._called = 0
        self._client: Any = None
        self._credential: Any = None
        self._task: asyncio.Task[None] | None = None

    async def serve(self) -> None:
        threading.Thread(target=self._read, name="eventhubs-receiver-pipe", daemon=True).start()
        try:
            while True:
                command = await self._commands.get()
                if isinstance(command, Stop):
                    return
                if isinstance(command, Start):
                    await self._close()
                    self._task = asyncio.create_task(self._receive(command))
        finally:
            await self._close()

    def _read(self) -> None:
        """The fleet's messages, until its end of the pipe closes: then the fleet is gone
        (killed, say) and so is the reason to receive: exit now."""
        while True:
            try:
                message = _FROM_FLEET.decode(self._connection.recv_bytes())
            except (EOFError, OSError):
                os._exit(0)
            self._loop.call_soon_threadsafe(self._dispatch, message)

    def _dispatch(self, message: ToReceiver) -> None:
        if isinstance(message, Done):
            self._settle(message)
        elif isinstance(message, Taken):
            for number in [n for n in self._untaken if n <= message.number]:
                self._queued -= self._untaken.pop(number)
            if self._queued < self._config.batch_size:
                self._make_room()
        elif isinstance(message, Reply):
            call = self._calls.pop(message.number, None)
            if call is not None and not call.done():
                if message.error is not None:
                    call.set_exception(RuntimeError(message.error))
                else:
                    call.set_result(message.result)
        else:
            self._commands.put_nowait(message)

    def _settle(self, done: Done) -> None:
        for number in [n for n in self._waiting if n <= done.number]:
            future = self._waiting.pop(number)
            if not future.done():
                if done.error is None:
                    future.set_result(None)
                else:
                    future.set_exception(RuntimeError(done.error))

    async def call(self, method: str, *arguments: Any) -> Any:
        self._called += 1
        future = self._loop.create_future()
        self._calls[self._called] = future
        self.send(Call(self._called, method, list(arguments)))
        return await future

    def _make_client(self) -> Any:
        from azure.eventhub.aio import EventHubConsumerClient

        from bridge.transports.eventhubs import open_client

        config = self._config
        sharing: dict[str, Any] = {}
        if config.share_partitions:
            sharing = {
                "checkpoint_store": _ownership(self),
                "load_balancing_interval": config.load_balancing_interval,
            }
        client, self._credential = open_client(
            EventHubConsumerClient, config, consumer_group=config.consumer_group, **sharing
        )
        return client

    async def _receive(self, start: Start) -> None:
        """Read every partition from where `start` says until closed; a failure (the hub
        unreachable, credentials refused, a receive ending with an error) is reported and
        the fleet says when to start again."""
        config = self._config
        try:
            self._client = self._make_client()
            default = _STARTS[config.start]
            partitions = await self._client.get_partition_ids()
            positions = {
                pid: int(start.checkpoints[pid]) if pid in start.checkpoints else default
                for pid in partitions
            }
            self.send(Receiving())
            log.info("source %s: starting at %s", config.name, positions)
            await self._client.receive_batch(
                self._on_batch,
                max_batch_size=config.batch_size,
                prefetch=config.batch_size * PREFETCH_BATCHES,
                starting_position=positions,
                starting_position_inclusive=False,
                on_error=self._on_error,
                on_partition_initialize=self._on_open,
                on_partition_close=self._on_close,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.send(Failed(f"{type(exc).__name__}: {exc}"))

    async def _close(self) -> None:
        for future in self._waiting.values():  # not committed: read again next time
            future.cancel()
        self._waiting.clear()
        self._untaken.clear()
        self._queued = 0
        self._make_room()
        task, self._task = self._task, None
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        credential, self._credential = self._credential, None
        if credential is not None:
            with contextlib.suppress(Exception):
                await credential.close()

    async def _on_batch(self, context: Any, events: list[Any]) -> None:
        if not events:
            return
        self._handed += 1
        number = self._handed
        position = str(events[-1].sequence_number)
        self.send(Handed(number, context.partition_id, position, [item(e) for e in events]))
        future = self._loop.create_future()
        self._waiting[number] = future
        self._untaken[number] = len(events)
        self._queued += len(events)
        if self._queued >= self._config.batch_size:  # back-pressure
            await self._committed_or_room(future)

    async def _committed_or_room(self, committed: asyncio.Future[None]) -> None:
        """Until this hand-over is committed (a failure raised here, as the SDK expects), or
        the fleet took enough for a commit that `batch_size` events no longer wait: this
        process learns what the fleet took a little late (`Taken`), and a partition waiting
        on a hand-over the fleet holds back for more would wait `batch_wait` for nothing."""
        if self._room is None:
            self._room = self._loop.create_future()
        await asyncio.wait([committed, self._room], return_when=asyncio.FIRST_COMPLETED)
        if committed.done():
            committed.result()

    def _make_room(self) -> None:
        room, self._room = self._room, None
        if room is not None and not room.done():
            room.set_result(None)

    async def _committed(self) -> None:
        """Until what is handed over now has been committed (or failed)."""
        waiting = list(self._waiting.values())
        if waiting:
            await asyncio.gather(*(asyncio.shield(w) for w in waiting), return_exceptions=True)

    async def _on_open(self, context: Any) -> None:
        self.send(Opened(context.partition_id))

    async def _on_close(self, context: Any, _reason: Any) -> None:
        self.send(Closed(context.partition_id))
        await self._committed()  # its checkpoint in the store before another reader starts

    async def _on_error(self, context: Any, error: Exception) -> None:
        where = f"partition {context.partition_id}" if context is not None else "the client"
        name = self._config.name
        log.warning("source %s: %s: %s: %s", name, where, type(error).__name__, error)


def _ownership(receiver: _Receiver) -> Any:
    """The SDK's checkpoint store, each call answered by `StoreOwnership` in the fleet."""
    from azure.eventhub.aio import CheckpointStore

    def listing(method: str) -> Callable[..., Coroutine[Any, Any, Iterable[dict[str, Any]]]]:
        """`list_ownership` or `list_checkpoints` (the SDK's names, answered in the fleet)."""

        async def listed(
            _self: Any,
            fully_qualified_namespace: str,
            eventhub_name: str,
            consumer_group: str,
            **_: Any,
        ) -> Iterable[dict[str, Any]]:
            rows: Iterable[dict[str, Any]] = await receiver.call(
                method, fully_qualified_namespace, eventhub_name, consumer_group
            )
            return rows

        return listed

    class _Ownership(CheckpointStore):
        list_ownership = listing("list_ownership")
        list_checkpoints = listing("list_checkpoints")

        async def claim_ownership(
            self, ownership_list: Iterable[dict[str, Any]], **_: Any
        ) -> Iterable[dict[str, Any]]:
            claimed: Iterable[dict[str, Any]] = await receiver.call(
                "claim_ownership", [dict(o) for o in ownership_list]
            )
            return claimed

        async def update_checkpoint(self, checkpoint: dict[str, Any], **_: Any) -> None:
            """Nothing: a batch's position commits with its events, in the fleet."""

    return _Ownership()
