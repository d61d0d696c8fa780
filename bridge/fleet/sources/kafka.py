"""The `kafka` source: one consumer group on one topic; offsets committed after the store commit.

confluent-kafka's consumer is blocking, so it lives in a thread of its own that alone calls
it (librdkafka runs rebalance callbacks inside `consume`, on that thread). The thread takes
up to `batch_size` messages (waiting `batch_wait` for more), decodes and checks them (the
contract, the bounds) and hands them to the event loop, where
`bridge.fleet.sources.bus.Committer` commits them in one store transaction (retrying while
the store fails). While that commit runs, the thread consumes, decodes and checks the next
batch; then it waits for the commit, hands the next batch to the store, and only then commits
the offsets following the committed messages to the broker (`enable.auto.commit=false`),
while the store writes the next batch. One store commit is in flight at most, and the event
loop is never blocked. A structured-mode message as the sidecars' sink writes it (its
`partitionkey` inside) is stored as it came, unconverted.

Nothing is lost and nothing doubled:

- A service killed between the store commit and the offset commit gets those messages
  again; the store's (source, id) key makes them duplicates, never doubles.
- A rebalance happens inside `consume`: the revoke callback first stores what the thread
  holds (the batch being gathered, the commit in flight), then commits the offsets of what
  the store holds and no broker commit confirmed yet (one that failed), so the member taking
  the partitions over starts right after it and stores none of it again. A consumer joining
  mid-stream starts at the group's offsets.
- Both modes of the CloudEvents Kafka binding are read (`bridge.transports.kafka_binding`);
  a message that is neither, or not a valid event of schema v1, goes to the rejected table
  with its reason and is committed past, so it cannot stall its partition. With `identity`
  set, the `bridgecredential` header is screened (`bridge.fleet.sources.bus`): a refused
  message goes to the rejected table and is committed past too.

`/readyz` shows the source false until the consumer joined the group, while every broker is
unreachable, and while the store cannot commit. Stopping closes the consumer (leaving the
group, so the others take its partitions at once). confluent-kafka is imported when the
source starts, never by the sidecar.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import msgspec

from bridge.fleet.identity.gate import IdentityGate
from bridge.fleet.kafka_config import KafkaSourceConfig
from bridge.fleet.sources.base import Ingestor, SourceHealth
from bridge.fleet.sources.bus import Committer, Decoded, check, decode
from bridge.infra.credential import ATTRIBUTE as CREDENTIAL_ATTRIBUTE
from bridge.transports.kafka_binding import (
    CONTENT_TYPE_HEADER,
    STRUCTURED_CONTENT_TYPE,
    Headers,
    record_credential,
    to_structured_json,
)

if TYPE_CHECKING:
    from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

log = logging.getLogger("bridge.fleet.kafka")

#: Seconds one `consume` call blocks at most when nothing arrives (how soon a stop is seen).
IDLE_POLL = 0.5
#: Seconds `stop` waits for the consumer to leave the group.
CLOSE_TIMEOUT = 30.0
#: `confluent_kafka.TIMESTAMP_LOG_APPEND_TIME`: the broker stamped the message (a topic with
#: `message.timestamp.type=LogAppendTime`); the default CreateTime is the producer's word.
LOG_APPEND_TIME = 2


def decoded(message: Message) -> Decoded:
    """One message as its event's structured JSON, or refused with the reason."""
    value = message.value() or b""
    headers = message.headers()
    kind, stamp = message.timestamp()
    taken = datetime.fromtimestamp(stamp / 1000, UTC) if kind == LOG_APPEND_TIME else None
    credential = record_credential(headers) if headers else None
    if _structured(headers):
        body = _as_sent(value)  # what the sidecars' sink writes in structured mode
        if body is not None:
            at = taken.timestamp() if taken else None
            return Decoded(body, None, credential, at, check(body))
    return decode(
        value,
        lambda: to_structured_json(headers, message.value(), message.key()),
        credential,
        taken,
    )


_STRUCTURED: Final = STRUCTURED_CONTENT_TYPE.encode()


def _structured(headers: Headers) -> bool:
    """The headers of a structured-mode message as the sidecars' Kafka sink writes them:
    the structured content type, and the instance credential if it has one."""
    if isinstance(headers, Mapping):
        return False  # never what a consumer gets: let the binding decide
    for name, raw in headers or ():
        if name == CONTENT_TYPE_HEADER:
            if raw != _STRUCTURED:
                return False
        elif name != CREDENTIAL_ATTRIBUTE:
            return False
    return True


def _as_sent(value: bytes) -> bytes | None:
    """A structured-mode value that already names its `partitionkey`, kept as the sidecar
    wrote it (the contract checks it next, as every body); None: it needs the binding's
    conversion (no partitionkey to take from the key, not a JSON object: refused there
    with the binding's reason). Rebuilding and re-serializing each event through the
    CloudEvents SDK was the largest per-message cost of the source."""
    try:
        named = _PARTITION_KEY.decode(value)
    except msgspec.DecodeError:
        return None
    return value if named.partitionkey else None


class _PartitionKeyOnly(msgspec.Struct):
    """A JSON object's `partitionkey` (PARTITION_KEY), the rest skipped unread: no dict of
    every field (0.8 against 2.1 us for a sidecar's event)."""

    partitionkey: Any = None


_PARTITION_KEY: Final = msgspec.json.Decoder(_PartitionKeyOnly)


def next_offsets(messages: Sequence[Message]) -> dict[tuple[str, int], int]:
    """Per partition, the offset that follows the last of `messages` (what to commit)."""
    offsets: dict[tuple[str, int], int] = {}
    for message in messages:
        key = (message.topic() or "", message.partition() or 0)
        offsets[key] = max(offsets.get(key, 0), (message.offset() or 0) + 1)
    return offsets


class KafkaSource:
    """`[[fleet.sources]] type = "kafka"` (see the module docstring)."""

    def __init__(self, config: KafkaSourceConfig, identity: IdentityGate | None = None) -> None:
        self.name = config.name
        self._config = config
        self.identity = identity
        self.servers, self.topic = config.target()
        self._committer: Committer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._in_flight: concurrent.futures.Future[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Consumed and decoded, not yet handed to the store (the consumer's thread only).
        self._held: list[Message] = []
        self._decoded: list[Decoded] = []
        #: The store commit in flight and the offsets that follow its messages.
        self._pending: tuple[concurrent.futures.Future[Any], dict[tuple[str, int], int]] | None = (
            None
        )
        #: Offsets the store holds and no broker commit confirmed yet.
        self._uncommitted: dict[tuple[str, int], int] = {}
        self._joined = False
        self._assigned: list[int] = []
        self._client_error: str | None = None
        self._failure: str | None = "not started"

    def __repr__(self) -> str:
        return f"KafkaSource(name={self.name!r}, topic={self.topic!r})"

    async def start(self, ingestor: Ingestor) -> None:
        self._committer = Committer(self.name, ingestor, self._config.bus(), self.identity)
        consumer = await asyncio.to_thread(self._consumer)
        self._stopping.clear()
        self._failure = None
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._run, args=(consumer, loop), name=f"fleet-{self.name}", daemon=True
        )
        self._thread.start()

    def _consumer(self) -> Consumer:
        try:
            import confluent_kafka
        except ModuleNotFoundError as exc:
            raise RuntimeError(
                "the kafka source needs confluent-kafka: pip install 'maintenance-bridge[kafka]'"
            ) from exc
        consumer = confluent_kafka.Consumer(
            self._config.consumer_settings(), logger=log, error_cb=self._on_client_error
        )
        consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
        return consumer

    async def stop(self) -> None:
        self._stopping.set()
        in_flight = self._in_flight
        if in_flight is not None:
            in_flight.cancel()  # a store that keeps failing must not hold the stop
        thread, self._thread = self._thread, None
        if thread is not None:
            await asyncio.to_thread(thread.join, CLOSE_TIMEOUT)
        self._failure = "stopped"

    def health(self) -> SourceHealth:
        if self._failure is not None:
            return SourceHealth(False, self._failure)
        if not self._joined:
            return SourceHealth(False, f"joining consumer group {self._config.group_id}")
        if self._client_error is not None:
            return SourceHealth(False, f"not consuming: {self._client_error}")
        committer = self._committer
        if committer is not None and committer.failing is not None:
            return SourceHealth(False, f"cannot commit: {committer.failing}")
        committed = committer.committed if committer is not None else 0
        partitions = ",".join(map(str, self._assigned)) or "none"
        return SourceHealth(True, f"{self.topic} partitions {partitions}: {committed} message(s)")

    # -- on the consumer's thread -----------------------------------------------------------

    def _run(self, consumer: Consumer, loop: asyncio.AbstractEventLoop) -> None:
        """Consume and decode the next batch while the store commits the previous one (one
        store commit in flight at most), then wait for that commit, hand the next batch to
        the store, and commit the offsets the store now holds to the broker while it writes
        (the broker's round trip no longer leaves the store idle)."""
        config = self._config
        self._loop = loop
        try:
            while not self._stopping.is_set():
                idle = IDLE_POLL if self._pending is None else 0
                self._take(consumer.consume(config.batch_size, idle))
                if self._held and len(self._held) < config.batch_size and config.batch_wait > 0:
                    wanted = config.batch_size - len(self._held)
                    self._take(consumer.consume(wanted, config.batch_wait))
                had = self._pending is not None
                self._settle()
                if self._held:
                    self._submit()
                elif not had:
                    self._recheck(consumer)
                if had:
                    self._commit_offsets(consumer)
        except Exception:
            log.exception("source %s: the consumer stopped", self.name)
            self._failure = "the consumer stopped (see the log)"
        finally:
            self._close(consumer)

    def _recheck(self, consumer: Consumer) -> None:
        """After a client error and with nothing arriving: a metadata request tells whether
        the cluster answers again (nothing else would clear the error on an idle topic)."""
        if self._client_error is None:
            return
        try:
            consumer.list_topics(self.topic, IDLE_POLL)
        except Exception:
            return
        self._client_error = None

    def _skipped(self, message: Message) -> bool:
        """A consumer event rather than a message (reported, never stored)."""
        error = message.error()
        if error is None:
            self._client_error = None
            return False
        if error.name() != "_PARTITION_EOF":
            log.warning("source %s: %s: %s", self.name, error.name(), error.str())
        return True

    def _take(self, messages: list[Message]) -> None:
        """Hold the messages of `messages` (not the consumer's events), decoded."""
        for message in messages:
            if not self._skipped(message):
                self._held.append(message)
                self._decoded.append(decoded(message))

    def _submit(self) -> None:
        """Hand the held batch to the event loop's store commit (`_pending` until settled)."""
        assert self._committer is not None
        assert self._loop is not None
        assert self._pending is None  # settled first: one store commit in flight at most
        batch, messages = self._held, self._decoded
        self._held, self._decoded = [], []
        future = asyncio.run_coroutine_threadsafe(self._committer.commit(messages), self._loop)
        self._in_flight = future
        if self._stopping.is_set():
            future.cancel()  # `stop` may have looked before this commit began
        self._pending = (future, next_offsets(batch))

    def _settle(self) -> None:
        """Wait for the store commit in flight and keep the offsets it reached for the
        broker (`_commit_offsets`); a commit cancelled by `stop` is not in the store, so its
        offsets are not kept and its messages come again."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        future, offsets = pending
        try:
            future.result()
        except concurrent.futures.CancelledError:
            return
        finally:
            self._in_flight = None
        self._uncommitted.update(offsets)

    def _commit_offsets(self, consumer: Consumer) -> None:
        """Commit what the store holds; a failure keeps it for the next try (or the revoke):
        until then a restart replays it as duplicates."""
        if not self._uncommitted:
            return
        from confluent_kafka import KafkaException, TopicPartition

        offsets = [TopicPartition(t, p, o) for (t, p), o in self._uncommitted.items()]
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            error = exc.args[0]
            log.warning(
                "source %s: cannot commit offsets (kept for the next try): %s",
                self.name,
                error.str() if hasattr(error, "str") else error,
            )
            return
        self._uncommitted.clear()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._joined = True
        self._assigned = sorted(p.partition for p in partitions)
        log.info("source %s: assigned %s partitions %s", self.name, self.topic, self._assigned)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Before the partitions go: store what this thread holds (a batch being gathered,
        one being committed), then commit the offsets the store holds, so the member taking
        them over starts right after them and stores none of them again. Stopping, the held
        batch is not stored: its messages come again (to whoever takes them)."""
        self._settle()  # the commit in flight first: `_submit` replaces it
        if self._held and not self._stopping.is_set():
            self._submit()
            self._settle()
        self._held, self._decoded = [], []
        self._commit_offsets(consumer)
        revoked = {p.partition for p in partitions}
        self._uncommitted = {k: o for k, o in self._uncommitted.items() if k[1] not in revoked}
        self._assigned = [p for p in self._assigned if p not in revoked]
        log.info("source %s: partitions %s revoked", self.name, sorted(revoked))

    def _on_client_error(self, error: KafkaError) -> None:
        """librdkafka's error callback: all brokers down, authentication, ... (health)."""
        if error.name() in ("_ALL_BROKERS_DOWN", "_AUTHENTICATION", "_SSL", "_RESOLVE") or (
            error.fatal()
        ):
            self._client_error = f"{error.name()}: {error.str()}"
        log.warning("source %s: %s: %s", self.name, error.name(), error.str())

    def _close(self, consumer: Consumer) -> None:
        """Leave the group (the revoke callback commits what is left), so the other
        members take the partitions over at once."""
        try:
            self._settle()
            self._held, self._decoded = [], []
            self._commit_offsets(consumer)
            consumer.close()
        except Exception as exc:
            log.warning("source %s: closing the consumer: %s", self.name, exc)
        self._joined = False
        self._assigned = []
