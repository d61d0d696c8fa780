"""The `kafka` source: one consumer group on one topic; offsets committed after the store commit.

confluent-kafka's consumer is blocking, so it lives in a thread of its own that alone calls
it (librdkafka runs rebalance callbacks inside `consume`, on that thread). The thread takes
up to `batch_size` messages (waiting `batch_wait` for more), hands them to the event loop,
where `bridge.fleet.sources.bus.Committer` commits them in one store transaction (retrying
while the store fails), and waits for that; only then does it commit the offsets following
them to the broker (`enable.auto.commit=false`). The event loop is never blocked.

Nothing is lost and nothing doubled:

- A service killed between the store commit and the offset commit gets those messages
  again; the store's (source, id) key makes them duplicates, never doubles.
- A rebalance happens inside `consume`, between batches, so the thread holds no message
  that is not in the store; the revoke callback commits the offsets of what the store holds
  and no broker commit confirmed yet (one that failed), so the member taking the partitions
  over starts right after it. A consumer joining mid-stream starts at the group's offsets.
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
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from bridge.fleet.identity.gate import IdentityGate
from bridge.fleet.kafka_config import KafkaSourceConfig
from bridge.fleet.sources.base import Ingestor, SourceHealth
from bridge.fleet.sources.bus import Committer, Decoded, decode
from bridge.transports.kafka_binding import record_credential, to_structured_json

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
    return decode(
        value,
        lambda: to_structured_json(headers, message.value(), message.key()),
        record_credential(headers),
        taken,
    )


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
        config = self._config
        try:
            while not self._stopping.is_set():
                messages = consumer.consume(config.batch_size, IDLE_POLL)
                if not messages:
                    self._recheck(consumer)
                    continue
                batch = [m for m in messages if not self._skipped(m)]
                if len(batch) < config.batch_size and config.batch_wait > 0:
                    more = consumer.consume(config.batch_size - len(batch), config.batch_wait)
                    batch.extend(m for m in more if not self._skipped(m))
                if not batch or not self._store(batch, loop):
                    continue
                self._uncommitted.update(next_offsets(batch))
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

    def _store(self, batch: list[Message], loop: asyncio.AbstractEventLoop) -> bool:
        """Commit `batch` to the store on the event loop; False when the source stops first."""
        assert self._committer is not None
        messages = [decoded(message) for message in batch]
        future = asyncio.run_coroutine_threadsafe(self._committer.commit(messages), loop)
        self._in_flight = future
        if self._stopping.is_set():
            future.cancel()  # `stop` may have looked before this commit began
        try:
            future.result()
        except concurrent.futures.CancelledError:
            return False  # stopping: not in the store, so not committed; redelivered
        finally:
            self._in_flight = None
        return True

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
        """Before the partitions go: commit what the store holds of them."""
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
            self._commit_offsets(consumer)
            consumer.close()
        except Exception as exc:
            log.warning("source %s: closing the consumer: %s", self.name, exc)
        self._joined = False
        self._assigned = []
