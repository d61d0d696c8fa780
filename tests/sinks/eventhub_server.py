"""Test fixture: a small Azure Event Hubs server speaking AMQP 1.0 on loopback.

FOR THE TEST SUITE ONLY. The official Event Hubs emulator is a Docker image and cannot run
here, and generic AMQP brokers (or qpid-proton, which trims trailing null fields) do not
satisfy the official client, whose decoder indexes every field of every performative. So this
server frames with the client's own codec (`azure.eventhub._pyamqp`), which is why the project
pins the exact `azure-eventhub` version: the private module may change in any release.

The UNMODIFIED official client connects with

    Endpoint=sb://127.0.0.1:PORT;SharedAccessKeyName=k;SharedAccessKey=v;EntityPath=hub;
    UseDevelopmentEmulator=true

(`UseDevelopmentEmulator` makes it speak plain AMQP on that port, without TLS). What it does,
and no more than the client needs (found by trying):

- SASL: offers MSSBCBS, PLAIN and ANONYMOUS and accepts whatever is chosen.
- `$cbs`: answers put-token with status-code 202 (401 when `refuse_tokens` is set) on the
  link whose source is `$cbs`, correlated by message id. Tokens are not checked.
- `$management`: READ of `com.microsoft:eventhub` and `com.microsoft:partition`.
- `<hub>` and `<hub>/Partitions/<n>`: accepts messages, batched ones too (message format
  0x80013700, one encoded event per data section). Without a partition id, the partition is
  a stable hash of the partition key (round robin without a key).
- `<hub>/ConsumerGroups/<cg>/Partitions/<n>`: serves receivers with the selector filter on
  offset / sequence number / enqueued time and the x-opt-sequence-number, x-opt-offset,
  x-opt-enqueued-time and x-opt-partition-key annotations. Offsets are sequence numbers.
- Failure modes for permanent errors: `delete_hub()` makes attaches to the hub fail with the
  service's `amqp:not-found` (as for a hub that does not exist), `refuse_tokens` refuses
  the put-token with 401. `stop()` / `start()` simulate an outage; events are kept and
  `start()` reuses the port, so clients reconnect to the same address.

Usage: `async with EventHubServer() as server: ... server.connection_string`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import re
import struct
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final

from azure.eventhub._pyamqp import performatives as perf
from azure.eventhub._pyamqp._decode import (
    _DECODE_BY_CONSTRUCTOR,
    decode_frame,
    decode_payload,
)
from azure.eventhub._pyamqp._encode import encode_frame, encode_payload, encode_value
from azure.eventhub._pyamqp.constants import HEADER_FRAME, SASL_HEADER_FRAME
from azure.eventhub._pyamqp.endpoints import Source, Target
from azure.eventhub._pyamqp.error import AMQPError
from azure.eventhub._pyamqp.message import Message, Properties
from azure.eventhub._pyamqp.outcomes import Accepted
from azure.eventhub._pyamqp.types import TYPE, VALUE, AMQPTypes

BATCH_FORMAT: Final = 0x80013700
MAX_MESSAGE_SIZE: Final = 1024 * 1024
MAX_FRAME_SIZE: Final = 1024 * 1024
_SASL_FRAME: Final = b"\x01"
_ANNOTATIONS: Final = 0x72
_HEADER: Final = 0x70
_FILTER: Final = re.compile(r"x-opt-(offset|sequence-number|enqueued-time)\s*(>=|>|=)\s*'([^']*)'")


@dataclass
class StoredEvent:
    """One accepted event: its encoded sections (minus annotations) and broker metadata."""

    sequence_number: int
    enqueued_ms: int
    partition_key: str | None
    header: bytes
    body: bytes

    def encode(self) -> bytes:
        """The message as delivered to a consumer, with the broker's annotations."""
        annotations: dict[bytes, Any] = {
            b"x-opt-sequence-number": {TYPE: AMQPTypes.long, VALUE: self.sequence_number},
            b"x-opt-offset": str(self.sequence_number),
            b"x-opt-enqueued-time": {TYPE: AMQPTypes.timestamp, VALUE: self.enqueued_ms},
        }
        if self.partition_key is not None:
            annotations[b"x-opt-partition-key"] = self.partition_key
        section = bytearray()
        encode_value(
            section,
            {
                TYPE: AMQPTypes.described,
                VALUE: (
                    {TYPE: AMQPTypes.ulong, VALUE: _ANNOTATIONS},
                    {
                        TYPE: AMQPTypes.map,
                        VALUE: [
                            ({TYPE: AMQPTypes.symbol, VALUE: k}, v) for k, v in annotations.items()
                        ],
                    },
                ),
            },
        )
        return self.header + bytes(section) + self.body


@dataclass
class Partition:
    events: list[StoredEvent] = field(default_factory=list)

    def properties(self, hub: str, pid: str) -> dict[str, Any]:
        last = self.events[-1] if self.events else None
        return {
            "name": hub,
            "type": "com.microsoft:partition",
            "partition": pid,
            "begin_sequence_number": {TYPE: AMQPTypes.long, VALUE: 0},
            "last_enqueued_sequence_number": {
                TYPE: AMQPTypes.long,
                VALUE: last.sequence_number if last else -1,
            },
            "last_enqueued_offset": str(last.sequence_number) if last else "-1",
            "last_enqueued_time_utc": {
                TYPE: AMQPTypes.long,
                VALUE: last.enqueued_ms if last else 0,
            },
            "is_partition_empty": last is None,
        }


def split_sections(raw: bytes) -> list[tuple[int, bytes]]:
    """Cut an encoded AMQP message into its (descriptor, encoded section) parts."""
    sections: list[tuple[int, bytes]] = []
    view = memoryview(raw)
    while view:
        descriptor = view[2]
        rest, _ = _DECODE_BY_CONSTRUCTOR[view[3]](view[4:])
        size = len(view) - len(rest)
        sections.append((descriptor, bytes(view[:size])))
        view = rest
    return sections


def partition_for(key: str, count: int) -> int:
    """Stable partition of a partition key (the real service hashes too, differently)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % count


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode()
    return str(value)


@dataclass
class _Link:
    name: bytes
    remote_handle: int
    local_handle: int
    client_sends: bool
    address: str
    snd_settle_mode: int | None
    rcv_settle_mode: int | None
    credit: int = 0
    delivery_count: int = 0
    received: int = 0
    partial: bytearray = field(default_factory=bytearray)
    partial_id: int | None = None
    partial_format: int = 0
    partial_settled: bool = False
    # consumer links
    partition: Partition | None = None
    cursor: int = 0
    outbox: list[bytes] = field(default_factory=list)
    detached: bool = False


@dataclass
class _Session:
    channel: int
    remote_channel: int
    links: dict[int, _Link] = field(default_factory=dict)
    next_outgoing_id: int = 0
    next_incoming_id: int = 0
    handles: itertools.count[int] = field(default_factory=itertools.count)


class _Connection:
    """One client connection: SASL, then performatives until close or EOF."""

    def __init__(
        self, server: EventHubServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.sessions: dict[int, _Session] = {}
        self.max_frame_size = 512
        self.closed = False

    def send(self, channel: int, frame: Any, frame_type: bytes = b"\x00") -> None:
        if self.closed:
            return
        header, body = encode_frame(frame, frame_type=frame_type)
        data = header if body is None else header + struct.pack(">H", channel) + bytes(body)
        self.writer.write(data)

    async def read_frame(self) -> tuple[int, int | None, list[Any]]:
        head = await self.reader.readexactly(8)
        size = int.from_bytes(head[:4], "big")
        doff = head[4]
        channel = int.from_bytes(head[6:8], "big")
        rest = await self.reader.readexactly(size - 8)
        body = rest[doff * 4 - 8 :]
        if not body:
            return channel, None, []
        code, fields = decode_frame(memoryview(body))
        return channel, code, fields

    async def run(self) -> None:
        header = await self.reader.readexactly(8)
        if header == SASL_HEADER_FRAME:
            self.writer.write(SASL_HEADER_FRAME)
            self.send(
                0,
                perf.SASLMechanism(sasl_server_mechanisms=[b"MSSBCBS", b"PLAIN", b"ANONYMOUS"]),
                _SASL_FRAME,
            )
            await self.read_frame()  # sasl-init: any mechanism and credentials are fine
            self.send(0, perf.SASLOutcome(code=0, additional_data=None), _SASL_FRAME)
            header = await self.reader.readexactly(8)
        self.writer.write(HEADER_FRAME)
        if header != HEADER_FRAME:
            return
        while not self.closed:
            channel, code, fields = await self.read_frame()
            if code is not None:
                self.handle(channel, code, fields)
            await self.writer.drain()

    def handle(self, channel: int, code: int, f: list[Any]) -> None:
        if code not in (0x10, 0x11, 0x18) and channel not in self.sessions:
            return  # a frame for a session that already ended
        if code == 0x10:  # open
            self.max_frame_size = min(f[2] or MAX_FRAME_SIZE, MAX_FRAME_SIZE)
            self.send(
                0,
                perf.OpenFrame(
                    "eventhub-test-server",
                    None,
                    MAX_FRAME_SIZE,
                    65535,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                ),
            )
        elif code == 0x11:  # begin
            session = _Session(channel, channel, next_incoming_id=f[1] or 0)
            self.sessions[channel] = session
            self.send(
                channel, perf.BeginFrame(channel, 0, 65536, 65536, 4294967295, None, None, None)
            )
        elif code == 0x12:
            self.on_attach(self.sessions[channel], f)
        elif code == 0x13:
            self.on_flow(self.sessions[channel], f)
        elif code == 0x14:
            self.on_transfer(self.sessions[channel], f)
        elif code == 0x16:  # detach
            session = self.sessions[channel]
            link = session.links.pop(f[0], None)
            if link is not None and not link.detached:
                self.send(channel, perf.DetachFrame(link.local_handle, True, None))
        elif code == 0x17:  # end
            self.sessions.pop(channel, None)
            self.send(channel, perf.EndFrame(None))
        elif code == 0x18:  # close
            self.send(0, perf.CloseFrame(None))
            self.closed = True

    # -- links -----------------------------------------------------------------------------

    def on_attach(self, session: _Session, f: list[Any]) -> None:
        name, handle, role = f[0], f[1], f[2]
        client_sends = not role
        source, target = f[5] or [], f[6] or []
        address = _entity_path(_text(target[0] if client_sends else source[0]) or "")
        link = _Link(
            name=name,
            remote_handle=handle,
            local_handle=next(session.handles),
            client_sends=client_sends,
            address=address,
            snd_settle_mode=f[3],
            rcv_settle_mode=f[4],
        )
        session.links[handle] = link
        self.send(
            session.channel,
            perf.AttachFrame(
                name,
                link.local_handle,
                client_sends,
                f[3],
                f[4],
                Source(address=_text(source[0]) if source else None),  # type: ignore[call-arg]
                Target(address=_text(target[0]) if target else None),  # type: ignore[call-arg]
                None,
                None,
                None if client_sends else 0,
                MAX_MESSAGE_SIZE,
                None,
                None,
                None,
            ),
        )
        error = self.server.check_address(address, client_sends)
        if error is not None:
            link.detached = True
            self.send(
                session.channel,
                perf.DetachFrame(
                    link.local_handle,
                    True,
                    AMQPError(condition=b"amqp:not-found", description=error),
                ),
            )
            return
        if client_sends:
            link.delivery_count = f[9] or 0
            self.grant(session, link)
        elif "/ConsumerGroups/" in address:
            pid = int(address.rsplit("/", 1)[1])
            link.partition = self.server.partitions[pid]
            filters = (source[7] if len(source) > 7 else None) or {}
            link.cursor = _start_index(link.partition, filters)

    def _flow(
        self,
        session: _Session,
        link: _Link,
        available: int | None = None,
        drain: bool | None = None,
    ) -> None:
        """A link FLOW frame stating the link's delivery count and credit."""
        self.send(
            session.channel,
            perf.FlowFrame(
                session.next_incoming_id,
                65536,
                session.next_outgoing_id,
                65536,
                link.local_handle,
                link.delivery_count,
                link.credit,
                available,
                drain,
                None,
                None,
            ),
        )

    def grant(self, session: _Session, link: _Link) -> None:
        link.credit = 1000
        self._flow(session, link)

    def on_flow(self, session: _Session, f: list[Any]) -> None:
        handle = f[4]
        if handle is None or handle not in session.links:
            return
        link = session.links[handle]
        if link.client_sends:
            return
        their_count = f[5] if f[5] is not None else 0
        link.credit = their_count + (f[6] or 0) - link.delivery_count
        self.pump(session, link)
        if f[8] and link.credit > 0:  # drain: use up the credit and say so
            link.delivery_count += link.credit
            link.credit = 0
            self._flow(session, link, available=0, drain=True)

    def pump(self, session: _Session, link: _Link) -> None:
        """Send what the link has for the client, as far as its credit goes."""
        while link.credit > 0 and not link.detached:
            if link.outbox:
                payload = link.outbox.pop(0)
            elif link.partition is not None and link.cursor < len(link.partition.events):
                payload = link.partition.events[link.cursor].encode()
                link.cursor += 1
            else:
                return
            delivery_id = session.next_outgoing_id
            session.next_outgoing_id += 1
            link.credit -= 1
            link.delivery_count += 1
            self.send(
                session.channel,
                perf.TransferFrame(
                    handle=link.local_handle,
                    delivery_id=delivery_id,
                    delivery_tag=struct.pack(">I", delivery_id),
                    message_format=0,
                    settled=True,
                    more=False,
                    payload=payload,
                ),
            )

    def pump_all(self) -> None:
        for session in list(self.sessions.values()):
            for link in list(session.links.values()):
                if link.partition is not None:
                    self.pump(session, link)

    # -- messages --------------------------------------------------------------------------

    def on_transfer(self, session: _Session, f: list[Any]) -> None:
        link = session.links.get(f[0])
        session.next_incoming_id += 1
        if link is None:
            return
        if link.partial_id is None:
            link.partial_id = f[1]
            link.partial_format = f[3] or 0
            link.partial_settled = bool(f[4])
        link.partial += bytes(f[-1])
        if f[5]:  # more
            return
        raw, delivery_id = bytes(link.partial), link.partial_id
        fmt, settled = link.partial_format, link.partial_settled
        link.partial, link.partial_id = bytearray(), None
        link.delivery_count += 1
        link.received += 1
        link.credit -= 1
        self.on_message(session, link, raw, fmt)
        if not settled:
            self.send(
                session.channel,
                perf.DispositionFrame(True, delivery_id, delivery_id, True, Accepted(), None),
            )
        if link.credit < 500:
            self.grant(session, link)

    def on_message(self, session: _Session, link: _Link, raw: bytes, fmt: int) -> None:
        message = decode_payload(memoryview(raw))
        if link.address in ("$cbs", "$management"):
            status, description, value = self.server.answer(link.address, message)
            props = message.properties
            reply = Message(
                properties=Properties(correlation_id=props.message_id if props else None),  # type: ignore[arg-type]
                application_properties={"status-code": status, "status-description": description},
                value=value,
            )
            payload = bytes(encode_payload(bytearray(), reply))
            reply_to = _text(props.reply_to) if props else None
            for other in session.links.values():
                if not other.client_sends and other.address in (link.address, reply_to):
                    other.outbox.append(payload)
                    self.pump(session, other)
                    break
            return
        self.server.store(link.address, raw, fmt, message)


def _entity_path(address: str) -> str:
    """`amqps://host:port/hub/Partitions/0` -> `hub/Partitions/0` (bare names unchanged)."""
    if "://" in address:
        address = address.split("://", 1)[1].partition("/")[2]
    return address


def _start_index(partition: Partition, filters: dict[Any, Any]) -> int:
    """Index of the first event the selector filter lets through."""
    for value in filters.values():
        match = _FILTER.search(_text(value) or "")
        if not match:
            continue
        what, op, text = match.groups()
        if text == "@latest":
            return len(partition.events)
        bound = int(text)
        for index, event in enumerate(partition.events):
            key = event.enqueued_ms if what == "enqueued-time" else event.sequence_number
            if key > bound or (op in (">=", "=") and key == bound):
                return index
        return len(partition.events)
    return 0


class EventHubServer:
    """The in-process Event Hubs test server (see the module docstring)."""

    def __init__(self, hub: str = "hub", partitions: int = 4, host: str = "127.0.0.1") -> None:
        self.hub = hub
        self.host = host
        self.port = 0
        self.partitions = [Partition() for _ in range(partitions)]
        self.hub_exists = True
        self.refuse_tokens = False
        self.created_ms = int(time.time() * 1000)
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._round_robin = itertools.count()
        self._sequence = itertools.count()

    @property
    def partition_ids(self) -> list[str]:
        return [str(i) for i in range(len(self.partitions))]

    @property
    def connection_string(self) -> str:
        return self.connection_string_for(self.hub)

    def connection_string_for(self, hub: str) -> str:
        return (
            f"Endpoint=sb://{self.host}:{self.port};SharedAccessKeyName=k;SharedAccessKey=v;"
            f"EntityPath={hub};UseDevelopmentEmulator=true"
        )

    @property
    def running(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        """Listen (again): on a random port the first time, on the same port afterwards."""
        self._server = await asyncio.start_server(
            self._accept, self.host, self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and drop every connection abruptly, like a network outage."""
        if self._server is None:
            return
        self._server.close()
        for conn in list(self._connections):
            conn.closed = True
            conn.writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._server.wait_closed()
        self._server = None

    async def __aenter__(self) -> EventHubServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def delete_hub(self) -> None:
        """From now on, the hub does not exist (attaches fail with amqp:not-found)."""
        self.hub_exists = False

    def events(self, partition: int) -> list[StoredEvent]:
        return list(self.partitions[partition].events)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(self, reader, writer)
        self._connections.add(conn)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await conn.run()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._connections.discard(conn)
            self._tasks.discard(task)
            writer.transport.abort()

    # -- the broker ------------------------------------------------------------------------

    def check_address(self, address: str, client_sends: bool) -> str | None:
        """Why attaching to `address` fails, or None when it is fine."""
        if address in ("$cbs", "$management"):
            return None
        entity = address.split("/", 1)[0]
        if entity != self.hub or not self.hub_exists:
            return (
                f"The messaging entity 'sb://{self.host}/{entity}' could not be found. "
                "To know more visit https://aka.ms/sbResourceMgrExceptions."
            )
        rest = address[len(entity) :]
        if client_sends and (rest == "" or re.fullmatch(r"/Partitions/\d+", rest)):
            pid = rest.rsplit("/", 1)[1] if rest else None
            if pid is None or int(pid) < len(self.partitions):
                return None
        if not client_sends:
            match = re.fullmatch(r"/ConsumerGroups/[^/]+/Partitions/(\d+)", rest)
            if match and int(match.group(1)) < len(self.partitions):
                return None
        return f"invalid address {address!r}"

    def answer(self, node: str, message: Message) -> tuple[int, str, Any]:
        """Status code, description and body value for a `$cbs` or `$management` request."""
        props = {_text(k): v for k, v in (message.application_properties or {}).items()}
        operation = _text(props.get("operation"))
        if node == "$cbs":
            if operation != "put-token":
                return 400, f"unknown operation {operation}", None
            if self.refuse_tokens:
                return 401, "InvalidSignature: The token has an invalid signature.", None
            return 202, "Accepted", None
        kind, name = _text(props.get("type")), _text(props.get("name"))
        if operation != "READ":
            return 400, f"unknown operation {operation}", None
        if name != self.hub or not self.hub_exists:
            return 404, f"The messaging entity '{name}' could not be found.", None
        if kind == "com.microsoft:eventhub":
            return (
                200,
                "OK",
                {
                    "name": self.hub,
                    "type": "com.microsoft:eventhub",
                    "created_at": {TYPE: AMQPTypes.timestamp, VALUE: self.created_ms},
                    "partition_count": len(self.partitions),
                    "partition_ids": self.partition_ids,
                },
            )
        if kind == "com.microsoft:partition":
            pid = _text(props.get("partition")) or "0"
            return 200, "OK", self.partitions[int(pid)].properties(self.hub, pid)
        return 400, f"unknown type {kind}", None

    def store(self, address: str, raw: bytes, fmt: int, message: Message) -> None:
        """Enqueue a (possibly batched) message sent to the hub or one of its partitions."""
        outer_key = _partition_key(message)
        inner = [bytes(d) for d in (message.data or [])] if fmt == BATCH_FORMAT else [raw]
        pid: int | None = None
        if "/Partitions/" in address:
            pid = int(address.rsplit("/", 1)[1])
        for encoded in inner:
            key = _partition_key(decode_payload(memoryview(encoded))) or outer_key
            if pid is not None:
                target = pid
            elif key is not None:
                target = partition_for(key, len(self.partitions))
            else:
                target = next(self._round_robin) % len(self.partitions)
            header, body = b"", bytearray()
            for descriptor, section in split_sections(encoded):
                if descriptor == _HEADER:
                    header = section
                elif descriptor != _ANNOTATIONS:
                    body += section
            partition = self.partitions[target]
            partition.events.append(
                StoredEvent(
                    sequence_number=len(partition.events),
                    enqueued_ms=int(time.time() * 1000),
                    partition_key=key,
                    header=header,
                    body=bytes(body),
                )
            )
        for conn in list(self._connections):
            conn.pump_all()


def _partition_key(message: Message) -> str | None:
    annotations = message.message_annotations or {}
    for key, value in annotations.items():
        if _text(key) == "x-opt-partition-key":
            return _text(value)
    return None
