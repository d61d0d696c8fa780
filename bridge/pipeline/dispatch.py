"""Delivery: one worker per sink drains that sink's queue in the spool, oldest first.

The dispatcher owns every retry, so all sinks share one policy: exponential backoff with
jitter capped at `delivery.retry_max`, never shorter than the sink's Retry-After, and no
total deadline (a sink down for an hour gets its events when it comes back). `Reject` moves
the batch to the dead-letter table, after splitting a multi-event batch so that one bad
event does not condemn its neighbours. A sink that raises instead of returning a result is
treated as a transient failure and logged with its traceback: a bug in one sink must not
stop delivery to the others.

Throughput without reordering: a worker reads a window of up to `READ_AHEAD` events in one
query, sends them strictly one batch after another (per-sink order is the spool's order) and
acknowledges the delivered ones in one spool transaction per window, or sooner when
`ACK_EVERY` seconds have passed, before it handles a failure, and on the way out (stop or
cancellation). A crash can therefore re-send at most two windows of already delivered
events, with the same ids: at-least-once, as before, and never a loss.

A window's acknowledgement transaction does not hold up the next window: the worker reads
window N+1 (skipping the events whose acknowledgement is not yet written, so none is sent
twice), hands window N's acknowledgements to a background write and sends window N+1 while
that transaction commits on the spool's thread. One such write is in flight at a time, so
at most two windows wait in memory. An acknowledgement that cannot be written is retried
with the sink's backoff, never re-sent; the worker waits for it before writing the next
one, before handling a failure, and before it goes idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Final, TypeVar

from tenacity import RetryCallState, retry_if_result

from bridge.infra import tracing
from bridge.infra.backoff import forever, retry_logger, retry_until_done
from bridge.infra.prometheus import PREFIX, Exposition
from bridge.pipeline.spool import Spool, Spooled, SpoolError
from bridge.sinkapi import Ok, Reject, Result, Retry, Sink

log = logging.getLogger("bridge.dispatch")

Sleep = Callable[[float], Awaitable[None]]
T = TypeVar("T")

#: Events a worker reads from the spool in one query (and acknowledges in one transaction).
READ_AHEAD: Final = 256
#: Longest time a delivered event waits for its acknowledgement to be written.
ACK_EVERY: Final = 0.5


@dataclass
class SinkStats:
    delivered: int = 0
    retried: int = 0
    dead_lettered: int = 0
    last_error: str | None = None
    last_success: float | None = None
    failing_since: float | None = None


def _retry_after_of_result(state: RetryCallState) -> float | None:
    if state.outcome is not None and not state.outcome.failed:
        result = state.outcome.result()
        if isinstance(result, Retry):
            return result.after
    return None


class Dispatcher:
    def __init__(
        self,
        spool: Spool,
        sinks: Sequence[Sink],
        *,
        retry_initial: float = 0.5,
        retry_max: float = 60.0,
        sleep: Sleep | None = None,
        spool_check_interval: float = 2.0,
    ) -> None:
        self._spool = spool
        self._spool_check_interval = spool_check_interval
        self._other_writers: asyncio.Task[None] | None = None
        self.sinks = list(sinks)
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        self._sleep = sleep or asyncio.sleep
        #: One per worker, set by the spool on every commit that adds events (and by `notify`).
        self._wakeups = {sink.name: spool.new_events() for sink in self.sinks}
        self._stopping = asyncio.Event()
        self.stats = {sink.name: SinkStats() for sink in self.sinks}
        self._tasks: list[asyncio.Task[None]] = []

    def export(self, out: Exposition) -> None:
        """The delivery counters for `/metrics`, per sink."""
        for metric, attribute, help_text in (
            ("events_delivered_total", "delivered", "Events the sink acknowledged."),
            ("events_retried_total", "retried", "Failed delivery attempts that will be retried."),
            ("events_dead_lettered_total", "dead_lettered", "Events the sink rejected for good."),
        ):
            out.add(
                PREFIX + metric,
                "counter",
                help_text,
                [({"sink": s.name}, getattr(self.stats[s.name], attribute)) for s in self.sinks],
            )

    def notify(self) -> None:
        """Wake every worker (a start, a stop, another process's commit; the spool wakes
        them itself on its own commits)."""
        for wakeup in self._wakeups.values():
            wakeup.set()

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._worker(sink), name=f"sink:{sink.name}") for sink in self.sinks
        ]
        self._other_writers = asyncio.create_task(self._watch_other_writers(), name="spool-check")

    async def _watch_other_writers(self) -> None:
        """Wake the workers when another process committed to the spool.

        `maintenance-bridge spool replay` puts dead letters back from its own process; no
        wake-up reaches the running bridge, so it checks SQLite's data version (one cheap
        PRAGMA) every `spool_check_interval` seconds and notifies on a change.
        """
        last: int | None = None
        while True:
            with contextlib.suppress(SpoolError):
                version = await self._spool.data_version()
                if last is not None and version != last:
                    log.info("the spool was changed by another process; looking for new work")
                    self.notify()
                last = version
            await asyncio.sleep(self._spool_check_interval)

    async def stop(self, timeout: float) -> None:
        """Finish in-flight sends and whatever else is ready within `timeout`, then stop.

        Workers that are idle or waiting out a backoff stop at once; the rest of the
        backlog stays in the spool for the next start.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._other_writers is not None:
            self._other_writers.cancel()
            await asyncio.gather(self._other_writers, return_exceptions=True)
        self._stopping.set()
        self.notify()
        if self._tasks:
            _, still_running = await asyncio.wait(self._tasks, timeout=timeout)
            for task in still_running:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            if still_running:
                log.warning(
                    "shutdown deadline reached; %d sink(s) still sending, kept in spool",
                    len(still_running),
                )
        left = max(0.1, deadline - loop.time())  # closing shares the same deadline
        await asyncio.gather(*(sink.close(left) for sink in self.sinks), return_exceptions=True)

    async def _attempt(self, sink: Sink, batch: list[Spooled]) -> Result:
        try:
            return await sink.publish_encoded(batch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("sink %s raised instead of returning a result", sink.name)
            return Retry(f"sink raised {type(exc).__name__}: {exc}")

    async def _interruptible_sleep(self, seconds: float) -> None:
        """Back off, but wake up for shutdown (the batch stays spooled)."""
        if self._stopping.is_set():
            raise _Stop
        sleeper = asyncio.ensure_future(self._sleep(seconds))
        stopper = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait([sleeper, stopper], return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            stopper.cancel()
        if self._stopping.is_set():
            raise _Stop

    async def _deliver(self, sink: Sink, batch: list[Spooled]) -> Result:
        """Send `batch` until the sink returns something other than `Retry`.

        The first attempt runs bare: building tenacity's retry state costs more than a
        webhook POST's own protocol work, and a draining backlog pays it per request. Only a
        batch whose first attempt asks for a retry enters the retry loop, which starts from
        that answer, so backoff and logging are the same as if it had run every attempt.
        """
        first = await self._attempt(sink, batch)
        if not isinstance(first, Retry):
            return first
        answers = [first]

        async def attempt() -> Result:
            return answers.pop() if answers else await self._attempt(sink, batch)

        stats = self.stats[sink.name]

        def reason_of(state: RetryCallState) -> str:
            result = state.outcome.result() if state.outcome else None
            return result.reason if isinstance(result, Retry) else "unknown"

        log_retry = retry_logger(
            log,
            f"sink {sink.name}: {len(batch)} event(s) not delivered",
            level=logging.WARNING,
            quiet=logging.INFO,
            loud=(1, 10),
            every=100,
            reason=reason_of,
        )

        async def before_sleep(state: RetryCallState) -> None:
            reason = reason_of(state)
            stats.retried += 1
            stats.last_error = reason
            stats.failing_since = stats.failing_since or time.time()
            log_retry(state)
            with contextlib.suppress(SpoolError):
                await self._spool.record_attempt(sink.name, [i.seq for i in batch], reason)

        retrying = forever(
            retry_if_result(lambda r: isinstance(r, Retry)),
            self._retry_initial,
            self._retry_max,
            _retry_after_of_result,
            sleep=self._interruptible_sleep,
            before_sleep=before_sleep,
        )
        result: Result = await retrying(attempt)
        return result

    async def _worker(self, sink: Sink) -> None:
        name = sink.name
        stats = self.stats[name]
        wakeup = self._wakeups[name]
        acks = _Acks(
            self._spool,
            name,
            stats,
            partial(self._spool_call, name, "acknowledge delivered events"),
        )
        single = False
        try:
            while True:
                wakeup.clear()
                limit = 1 if single else max(sink.max_batch, READ_AHEAD)
                after = acks.unwritten_up_to()
                window = await self._spool_call(
                    name, "read the spool", partial(self._spool.pending, name, limit, after)
                )
                # Read first, then write: the spool's thread runs both in turn, and the
                # acknowledgements commit while this window is sent.
                await acks.write_in_background()
                if not window:
                    if after:  # events skipped for their acknowledgement: look again once written
                        await acks.settle()
                        continue
                    single = False
                    if self._stopping.is_set():
                        return
                    # The commit that wakes this worker reads its next window for it.
                    self._spool.waiting(name, max(sink.max_batch, READ_AHEAD))
                    await wakeup.wait()
                    continue
                single = await self._send_window(sink, window, 1 if single else None, acks)
        except _Stop:
            return
        finally:
            try:
                await acks.last_write()
            except SpoolError as exc:
                log.error("sink %s: cannot acknowledge delivered events: %s", name, exc)

    async def _spool_call(self, sink: str, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """`call`, retried while the spool fails, with the backoff of a failing sink.

        A spool that cannot be written must not turn into a storm: delivered events wait in
        memory for their acknowledgement (they are not sent again meanwhile), and every
        retry waits like a sink retry, up to `retry_max`. Raises `_Stop` on shutdown.
        """
        return await retry_until_done(
            call,
            retry_on=SpoolError,
            initial=self._retry_initial,
            maximum=self._retry_max,
            before_sleep=retry_logger(
                log, f"sink {sink}: cannot {what}", quiet=logging.INFO, loud=(1, 10), every=100
            ),
            sleep=self._interruptible_sleep,
        )

    async def _send_window(
        self, sink: Sink, window: list[Spooled], step: int | None, acks: _Acks
    ) -> bool:
        """Send `window` in order, `step` (default: the sink's batch size) events at a time.

        Returns whether the next read must go one event at a time (a batch was rejected:
        find the poisonous event(s) alone). Stops at the first failure, so that what follows
        it is read again from the spool.
        """
        name = sink.name
        stats = self.stats[name]
        size = step or sink.max_batch
        for start in range(0, len(window), size):
            batch = window[start : start + size]
            await self._spool.durable([item.seq for item in batch])  # never before its fsync
            sending = time.time()
            result = await self._deliver(sink, batch)
            traced = ((tracing.traceparent_of(item.body), item.id) for item in batch)
            tracing.record("deliver", traced, sending, _outcome(name, result))
            if isinstance(result, Ok):
                acks.add(batch)
                if acks.due():
                    await acks.write_in_background()
                continue
            await acks.settle()
            if isinstance(result, Reject) and len(batch) > 1:
                return True
            if isinstance(result, Reject):
                log.error(
                    "sink %s rejected event %s for good: %s (dead-lettered)",
                    name,
                    batch[0].id,
                    result.reason,
                )
                seqs = [item.seq for item in batch]
                await self._spool_call(
                    name,
                    "dead-letter an event",
                    partial(self._spool.dead_letter, name, seqs, result.reason),
                )
                stats.dead_lettered += 1
                stats.last_error = result.reason
            return step == 1
        return step == 1  # the worker writes the acknowledgements while it sends the next


def _outcome(sink: str, result: Result) -> dict[str, str]:
    """A deliver span's attributes (bridge/infra/tracing.py)."""
    return {"maintenance_bridge.sink": sink, "maintenance_bridge.outcome": type(result).__name__}


class _Stop(Exception):
    """Raised inside a backoff when shutdown begins."""


@dataclass
class _Acks:
    """Delivered events of one sink waiting to be acknowledged in the spool together, and
    the one acknowledgement write that may run in the background (see the module docstring).
    """

    spool: Spool
    sink: str
    stats: SinkStats
    #: Runs a spool call, retried with the sink's backoff while the spool fails.
    retrying: Callable[[Callable[[], Awaitable[None]]], Awaitable[None]]
    #: Delivered, not yet handed to a write.
    seqs: list[int] = field(default_factory=list)
    since: float = 0.0
    #: Handed to the write in flight, until it is written.
    writing_seqs: list[int] = field(default_factory=list)
    writing: asyncio.Task[None] | None = None

    def add(self, batch: Sequence[Spooled]) -> None:
        if not self.seqs:
            self.since = time.monotonic()
        self.seqs.extend(item.seq for item in batch)

    def due(self) -> bool:
        return len(self.seqs) >= READ_AHEAD or time.monotonic() - self.since >= ACK_EVERY

    def unwritten_up_to(self) -> int:
        """The highest seq delivered whose acknowledgement is not yet written (0: none):
        the next read starts after it, so that no delivered event is sent again."""
        return max(max(self.seqs, default=0), max(self.writing_seqs, default=0))

    async def _write(self, seqs: list[int]) -> None:
        """Write the acknowledgements (retried, never re-sent); the stats count an event once
        it is acknowledged."""
        await self.retrying(partial(self.spool.ack, self.sink, seqs))
        self.stats.delivered += len(seqs)
        self.stats.last_success = time.time()
        self.stats.failing_since = None

    async def _written(self) -> None:
        """Wait for the write in flight, if any (raises `_Stop` if shutdown interrupted it)."""
        if self.writing is not None:
            task = self.writing
            await task
            self.writing = None
            self.writing_seqs = []

    async def write_in_background(self) -> None:
        """Start writing the acknowledgements gathered so far, once the write in flight is
        done; return without waiting for this one (nothing gathered: return at once)."""
        if not self.seqs:
            return
        await self._written()
        self.writing_seqs, self.seqs = self.seqs, []
        self.writing = asyncio.create_task(self._write_in_flight())

    async def _write_in_flight(self) -> None:
        await self._write(self.writing_seqs)
        self.writing_seqs = []  # written: `last_write` must not count them again

    async def settle(self) -> None:
        """Write every acknowledgement now (before a failure is handled, before idling)."""
        await self._written()
        if self.seqs:
            await self._write(self.seqs)
            self.seqs = []

    async def last_write(self) -> None:
        """On the way out: one direct attempt for whatever is not written yet (a stop must
        not wait out a backoff); `SpoolError` if it fails, and those events are sent again
        after the restart (same ids)."""
        if self.writing is not None:
            self.writing.cancel()
            await asyncio.gather(self.writing, return_exceptions=True)
            self.writing = None
        seqs = self.writing_seqs + self.seqs
        self.writing_seqs, self.seqs = [], []
        if seqs:
            await self.spool.ack(self.sink, seqs)
            self.stats.delivered += len(seqs)
            self.stats.last_success = time.time()
            self.stats.failing_since = None
