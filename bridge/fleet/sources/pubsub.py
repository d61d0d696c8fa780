"""The `pubsub` source: a streaming pull on one subscription; ack only after the store commit.

The subscriber client runs the streaming pull on its own threads and hands each message to
`_on_message`, which only queues it for the event loop. One task takes the queue in batches
(`batch_size`, `batch_wait`), commits each batch in one store transaction
(`bridge.fleet.sources.bus.Committer`) and only then acknowledges its messages. Until then
the client keeps extending their leases, so nothing is redelivered while the store is slow;
if the service dies before the ack, Pub/Sub redelivers and the store's (source, id) key
makes the replay a duplicate, never a double.

Both content modes of the sidecars' Pub/Sub sink (Google's CloudEvents binding) are read:
binary (`ce-*` attributes, the JSON `data` as the message) and structured (the whole event
as the message). A message that is neither, or not a valid event of schema v1, goes to the
rejected table with its reason and is acknowledged, so it cannot loop. With `identity` set,
the `bridgecredential` attribute is screened (`bridge.fleet.sources.bus`): a refused message
goes to the rejected table and is acknowledged too.

A broken stream (subscription deleted, permissions, a long outage) ends the client's pull
future: `/readyz` turns false for the source with the reason, and the source subscribes
again with backoff until it consumes. Stopping cancels the pull and nacks what was received
but not committed, so another replica gets it at once.

`google.cloud.pubsub_v1` is imported when the source starts, never by the sidecar.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type

from bridge.fleet.bus_config import PubsubSourceConfig
from bridge.fleet.identity.gate import IdentityGate
from bridge.fleet.sources.base import Ingestor, SourceHealth
from bridge.fleet.sources.bus import Committer, Decoded, decode, next_batch
from bridge.infra.backoff import Backoff
from bridge.transports.pubsub import PUBSUB_SCOPE, message_credential, message_event

log = logging.getLogger("bridge.fleet.pubsub")


class PubsubSource:
    """`[[fleet.sources]] type = "pubsub"` (see the module docstring)."""

    def __init__(self, config: PubsubSourceConfig, identity: IdentityGate | None = None) -> None:
        self.name = config.name
        self._config = config
        self.identity = identity
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._subscriber: Any = None
        self._pull: Any = None
        self._committer: Committer | None = None
        self._stream_error: str | None = "not started"
        self._in_flight: list[Any] = []

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
            asyncio.create_task(self._stream(), name=f"fleet-{self.name}-stream"),
            asyncio.create_task(self._consume(self._committer), name=f"fleet-{self.name}"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        pull, self._pull = self._pull, None
        if pull is not None:
            pull.cancel()  # its leaser stops extending the leases of what we still hold
            with contextlib.suppress(Exception):
                await asyncio.to_thread(pull.result, 10)
        held = self._in_flight + [self._queue.get_nowait() for _ in range(self._queue.qsize())]
        self._in_flight = []
        if held and self._subscriber is not None:
            await asyncio.to_thread(self._release, [m.ack_id for m in held])
        if self._subscriber is not None:
            await asyncio.to_thread(self._subscriber.close)
            self._subscriber = None
        self._stream_error = "stopped"

    def _release(self, ack_ids: list[str]) -> None:
        """Received, not committed: back to the subscription now rather than at lease
        expiry (a deadline of 0 is a nack; the stopped pull's own nacks may not be sent)."""
        try:
            for start in range(0, len(ack_ids), 1000):
                self._subscriber.modify_ack_deadline(
                    request={
                        "subscription": self._config.subscription,
                        "ack_ids": ack_ids[start : start + 1000],
                        "ack_deadline_seconds": 0,
                    }
                )
        except Exception as exc:  # they come back at lease expiry anyway
            log.warning("source %s: cannot release %d message(s): %s", self.name, len(ack_ids), exc)

    def health(self) -> SourceHealth:
        committer = self._committer
        if self._stream_error is not None:
            return SourceHealth(False, self._stream_error)
        if committer is not None and committer.failing is not None:
            return SourceHealth(False, f"cannot commit: {committer.failing}")
        committed = committer.committed if committer is not None else 0
        return SourceHealth(True, f"{self._config.subscription}: {committed} message(s)")

    # -- the stream -------------------------------------------------------------------------

    async def _stream(self) -> None:
        """Keep one streaming pull open; when it ends with an error, open another after a
        backoff (`bridge.infra.backoff`), for as long as the source runs."""
        from google.cloud import pubsub_v1

        loop = asyncio.get_running_loop()
        inbox: collections.deque[Any] = collections.deque()
        woken = threading.Event()  # set: the event loop has yet to take the inbox

        def take() -> None:  # on the event loop
            woken.clear()
            while inbox:
                self._queue.put_nowait(inbox.popleft())

        def on_message(message: Any) -> None:  # on the client's thread (see _Inline)
            inbox.append(message)
            if not woken.is_set():
                woken.set()
                loop.call_soon_threadsafe(take)

        flow = pubsub_v1.types.FlowControl(
            max_messages=self._config.max_outstanding,
            max_duration_per_lease_extension=self._config.lease_extension,
        )
        retrying = AsyncRetrying(
            wait=Backoff(self._config.retry_initial, self._config.retry_max, lambda _s: None),
            retry=retry_if_exception_type(_StreamEnded),
        )
        async for attempt in retrying:
            with attempt:
                self._pull = self._subscriber.subscribe(
                    self._config.subscription,
                    callback=on_message,
                    flow_control=flow,
                    scheduler=_inline_scheduler(),
                )
                self._stream_error = None
                try:
                    await asyncio.wrap_future(self._pull)
                    reason = "the streaming pull ended"
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    reason = f"{type(exc).__name__}: {exc}"
                self._stream_error = f"not consuming: {reason}"
                log.warning("source %s: %s; subscribing again", self.name, reason)
                raise _StreamEnded(reason)

    async def _consume(self, committer: Committer) -> None:
        config = self._config
        while True:
            messages = await next_batch(self._queue, config.batch_size, config.batch_wait)
            self._in_flight = messages
            try:
                await committer.commit([_decoded(message) for message in messages])
            except Exception:  # a bug, not bad input: keep consuming, Pub/Sub redelivers
                log.exception("source %s: cannot commit a batch; releasing it", self.name)
                for message in messages:
                    message.nack()
                self._in_flight = []
                await asyncio.sleep(config.retry_max)
                continue
            for message in messages:
                message.ack()
            self._in_flight = []


def _decoded(message: Any) -> Decoded:
    attributes = message.attributes
    return decode(
        message.data,
        lambda: message_event(message.data, attributes),
        message_credential(attributes),
        message.publish_time,  # set by Pub/Sub when it took the message
    )


def _inline_scheduler() -> Any:
    """The client's scheduler, but calling `on_message` on the client's own thread rather
    than through a pool of ten threads: `on_message` only queues the message for the event
    loop, and a thread hop per message was most of the source's cost."""
    import queue

    from google.cloud.pubsub_v1.subscriber.scheduler import (  # type: ignore[import-untyped]
        Scheduler,
    )

    class Inline(Scheduler):  # type: ignore[misc]
        def __init__(self) -> None:
            self._queue: queue.Queue[Any] = queue.Queue()

        @property
        def queue(self) -> queue.Queue[Any]:
            return self._queue

        def schedule(self, callback: Any, *args: Any, **kwargs: Any) -> None:
            callback(*args, **kwargs)

        def shutdown(self, await_msg_callbacks: bool = False) -> list[Any]:
            return []  # nothing waits: every message went to its callback at once

    return Inline()


class _StreamEnded(Exception):
    """The streaming pull ended; subscribe again."""
