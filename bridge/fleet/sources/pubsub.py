"""The `pubsub` source: pulls of up to `batch_size` messages on one subscription; ack only
after the store commit.

One task pulls (the unary `Pull` RPC, on a worker thread, `batch_size` messages at most per
call; the same thread decodes and checks what came, while the previous batch commits) and
queues it for another task, which gathers up to `batch_size` messages (waiting `batch_wait`
for more), commits them in one store transaction (`bridge.fleet.sources.bus.Committer`) and
only then acknowledges them (one `Acknowledge` call per batch, while the next batch
commits). Pulling goes on while a batch commits, `max_outstanding` messages held at most.
Until their ack the source extends the leases of what it holds (`lease_extension` seconds
each time), so nothing is redelivered while the store is slow; if the service dies before
the ack, Pub/Sub redelivers and the store's (source, id) key makes the replay a duplicate,
never a double.

Why not the client library's streaming pull: it hands every message through a pool of ten
threads, acks, leases and flow-controls message by message in Python, and the emulator
feeds a stream slowly: a bare streaming pull drained a backlog from the emulator at about
1,900 messages/s where a bare loop of pulls of 1,000 did 8,000 on the same machine, with a
quarter of the CPU on both sides.

Both content modes of the sidecars' Pub/Sub sink (Google's CloudEvents binding) are read:
binary (`ce-*` attributes, the JSON `data` as the message) and structured (the whole event
as the message). A message that is neither, or not a valid event of schema v1, goes to the
rejected table with its reason and is acknowledged, so it cannot loop. With `identity` set,
the `bridgecredential` attribute is screened (`bridge.fleet.sources.bus`): a refused message
goes to the rejected table and is acknowledged too.

A pull that fails (subscription deleted, permissions, a long outage) turns `/readyz` false
for the source with the reason, and the source pulls again with backoff until it consumes.
Stopping releases what was received but not committed (a deadline of 0), so another replica
gets it at once.

`google.cloud.pubsub_v1` is imported when the source starts, never by the sidecar.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC
from typing import Any, Final

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from bridge.fleet.bus_config import PubsubSourceConfig
from bridge.fleet.identity.gate import IdentityGate
from bridge.fleet.sources.base import Ingestor, SourceHealth
from bridge.fleet.sources.bus import Committer, Decoded, decode
from bridge.infra.backoff import Backoff
from bridge.transports.pubsub import PUBSUB_SCOPE, message_credential, message_event

log = logging.getLogger("bridge.fleet.pubsub")

#: Seconds one pull waits for messages when there are none (how soon a stop is seen too).
PULL_TIMEOUT: Final = 5.0
#: Ack ids per `Acknowledge` / `ModifyAckDeadline` call (the API takes 2,500 at most).
IDS_PER_CALL: Final = 1000


class PubsubSource:
    """`[[fleet.sources]] type = "pubsub"` (see the module docstring)."""

    def __init__(self, config: PubsubSourceConfig, identity: IdentityGate | None = None) -> None:
        self.name = config.name
        self._config = config
        self.identity = identity
        # Queued pulls, besides the batch committing and the one being acknowledged.
        batches = max(1, config.max_outstanding // config.batch_size - 2)
        self._queue: asyncio.Queue[list[tuple[str, Decoded]]] = asyncio.Queue(batches)
        self._tasks: list[asyncio.Task[None]] = []
        self._subscriber: Any = None
        self._committer: Committer | None = None
        self._stream_error: str | None = "not started"
        #: Ack ids of everything pulled and not yet acked or released (in pull order).
        self._held: dict[str, None] = {}
        #: The acknowledgements of committed batches in flight.
        self._acking: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"PubsubSource(name={self.name!r}, subscription={self._config.subscription!r})"

    def _client(self) -> Any:
        from google.cloud import pubsub_v1  # type: ignore[import-untyped]

        kwargs: dict[str, Any] = {}
        if self._config.credentials_file is not None:
            from google.oauth2 import service_account

            kwargs["credentials"] = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
                str(self._config.credentials_file), scopes=[PUBSUB_SCOPE]
            )
        if self._config.endpoint:
            kwargs["client_options"] = {"api_endpoint": self._config.endpoint}
        return pubsub_v1.SubscriberClient(**kwargs)

    async def start(self, ingestor: Ingestor) -> None:
        self._committer = Committer(self.name, ingestor, self._config, self.identity)
        self._subscriber = await asyncio.to_thread(self._client)
        self._tasks = [
            asyncio.create_task(self._pull(), name=f"fleet-{self.name}-pull"),
            asyncio.create_task(self._leases(), name=f"fleet-{self.name}-leases"),
            asyncio.create_task(self._consume(self._committer), name=f"fleet-{self.name}"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        # Committed batches are acknowledged, not released.
        await asyncio.gather(*self._acking, return_exceptions=True)
        held, self._held = list(self._held), {}
        while not self._queue.empty():
            self._queue.get_nowait()
        if held and self._subscriber is not None:
            await asyncio.to_thread(self._release, held)
        if self._subscriber is not None:
            await asyncio.to_thread(self._subscriber.close)
            self._subscriber = None
        self._stream_error = "stopped"

    def _deadline(self, ack_ids: list[str], seconds: int) -> None:
        for start in range(0, len(ack_ids), IDS_PER_CALL):
            self._subscriber.modify_ack_deadline(
                request={
                    "subscription": self._config.subscription,
                    "ack_ids": ack_ids[start : start + IDS_PER_CALL],
                    "ack_deadline_seconds": seconds,
                }
            )

    def _release(self, ack_ids: list[str]) -> None:
        """Received, not committed: back to the subscription now rather than at lease
        expiry (a deadline of 0 is a nack)."""
        try:
            self._deadline(ack_ids, 0)
        except Exception as exc:  # they come back at lease expiry anyway
            log.warning("source %s: cannot release %d message(s): %s", self.name, len(ack_ids), exc)

    def _acknowledge(self, ack_ids: list[str]) -> None:
        for start in range(0, len(ack_ids), IDS_PER_CALL):
            self._subscriber.acknowledge(
                request={
                    "subscription": self._config.subscription,
                    "ack_ids": ack_ids[start : start + IDS_PER_CALL],
                }
            )

    def health(self) -> SourceHealth:
        committer = self._committer
        if self._stream_error is not None:
            return SourceHealth(False, self._stream_error)
        if committer is not None and committer.failing is not None:
            return SourceHealth(False, f"cannot commit: {committer.failing}")
        committed = committer.committed if committer is not None else 0
        return SourceHealth(True, f"{self._config.subscription}: {committed} message(s)")

    # -- pulling, leases, committing --------------------------------------------------------

    async def _pull(self) -> None:
        """Pull batches for as long as the source runs; a pull that fails is tried again
        after a backoff (`bridge.infra.backoff`), `/readyz` saying why meanwhile."""
        config = self._config
        retrying = AsyncRetrying(
            wait=Backoff(config.retry_initial, config.retry_max, lambda _s: None),
            retry=retry_if_exception_type(Exception),
            before_sleep=self._pull_failed,
        )
        while True:
            received: list[tuple[str, Decoded]] = []
            async for attempt in retrying:
                with attempt:
                    received = await asyncio.to_thread(self._pull_once)
            self._stream_error = None
            if received:
                self._held.update(dict.fromkeys(ack_id for ack_id, _ in received))
                await self._queue.put(received)

    def _pull_failed(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        reason = f"{type(error).__name__}: {error}"
        if self._stream_error is None or self._stream_error == "not started":
            log.warning("source %s: cannot pull: %s; pulling again", self.name, reason)
        self._stream_error = f"not consuming: {reason}"

    def _pull_once(self) -> list[tuple[str, Decoded]]:
        """Up to `batch_size` messages (ack id, decoded and checked, on this worker thread
        while the consumer commits the previous batch); none when none came within
        PULL_TIMEOUT."""
        from google.api_core import exceptions

        try:
            response = self._subscriber.pull(
                request={
                    "subscription": self._config.subscription,
                    "max_messages": self._config.batch_size,
                },
                timeout=PULL_TIMEOUT,
            )
        except exceptions.DeadlineExceeded:
            return []
        screened = self.identity is not None and self.identity.mode != "off"
        # The protobuf messages themselves: the client's wrappers convert each field on
        # each access (about 15 us a message, half of what a pull's message cost here).
        pulled = type(response).pb(response).received_messages
        return [(r.ack_id, _decoded(r.message, screened)) for r in pulled]

    async def _leases(self) -> None:
        """Extend the leases of what the source holds, `lease_extension` seconds each time,
        a third of it apart, so nothing it holds is redelivered while the store is slow."""
        seconds = self._config.lease_extension
        while True:
            await asyncio.sleep(seconds / 3)
            held = list(self._held)
            if held:
                try:
                    await asyncio.to_thread(self._deadline, held, seconds)
                except Exception as exc:  # a lapsed lease means a redelivery: a duplicate
                    log.warning("source %s: cannot extend leases: %s", self.name, exc)

    async def _consume(self, committer: Committer) -> None:
        config = self._config
        while True:
            received = await self._gathered()
            ack_ids = [ack_id for ack_id, _ in received]
            try:
                await committer.commit([decoded for _, decoded in received])
            except Exception:  # a bug, not bad input: keep consuming, Pub/Sub redelivers
                log.exception("source %s: cannot commit a batch; releasing it", self.name)
                await asyncio.to_thread(self._release, ack_ids)
                self._forget(ack_ids)
                await asyncio.sleep(config.retry_max)
                continue
            # Acknowledged while the next batch commits: one ack in flight when it begins.
            acking = asyncio.create_task(self._acknowledged(ack_ids))
            earlier = list(self._acking)
            self._acking.add(acking)
            acking.add_done_callback(self._acking.discard)
            if earlier:
                await asyncio.wait(earlier)  # never cancels them: `stop` waits for them

    async def _acknowledged(self, ack_ids: list[str]) -> None:
        """Acknowledge a committed batch (never cancelled by `stop`, which waits for it)."""
        try:
            await asyncio.to_thread(self._acknowledge, ack_ids)
        except Exception as exc:  # redelivered at lease expiry: duplicates, not doubles
            log.warning("source %s: cannot acknowledge %d: %s", self.name, len(ack_ids), exc)
        self._forget(ack_ids)

    async def _gathered(self) -> list[tuple[str, Decoded]]:
        """The next pulled batch, and those pulled within `batch_wait` after it, up to
        `batch_size` messages (a pull returns fewer than asked: 100 from the emulator)."""
        loop = asyncio.get_running_loop()
        received = await self._queue.get()
        deadline = loop.time() + self._config.batch_wait
        while len(received) < self._config.batch_size:
            if not self._queue.empty():
                received += self._queue.get_nowait()
                continue
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                received += await asyncio.wait_for(self._queue.get(), left)
            except TimeoutError:
                break
        return received

    def _forget(self, ack_ids: list[str]) -> None:
        for ack_id in ack_ids:
            self._held.pop(ack_id, None)


def _decoded(message: Any, screened: bool) -> Decoded:
    """`message`: a protobuf `PubsubMessage`. `screened`: the identity gate checks the
    credential at the publish time (set by Pub/Sub when it took the message); without a
    gate neither is read."""
    attributes = message.attributes
    data = message.data
    return decode(
        data,
        lambda: message_event(data, attributes),
        message_credential(attributes) if screened else None,
        message.publish_time.ToDatetime(tzinfo=UTC) if screened else None,
    )
