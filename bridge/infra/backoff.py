"""The one backoff policy: exponential with jitter, capped, never shorter than Retry-After.

Used by the metadata client (retrying the metadata service), by the dispatcher (retrying
a sink), by every loop that must not give up (`retry_until_done`), by the runner's
watcher supervision (`keep_running`) and by the blocking calls retried for a bounded time on
a thread (`retry_for`: the fleet's SQLite switch to WAL), so they cannot drift apart. How
a Retry-After reaches the policy differs: the metadata client raises it inside an
exception, a sink returns it inside a `Retry` result; `retry_after` reads either from
tenacity's retry state. Both read the header itself with `parse_retry_after`, the one
parser of it (seconds or an HTTP date).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Final, NoReturn, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_delay,
    stop_never,
    wait_exponential_jitter,
)
from tenacity.retry import retry_base

from bridge.infra.timeparse import TimeParseError, parse_time

T = TypeVar("T")

#: A server asking us to wait longer than this is not taken literally.
MAX_RETRY_AFTER: Final = 3600.0


class Backoff:
    def __init__(
        self,
        initial: float,
        maximum: float,
        retry_after: Callable[[RetryCallState], float | None],
    ) -> None:
        self._exponential = wait_exponential_jitter(multiplier=initial, max=maximum, jitter=initial)
        self._retry_after = retry_after

    def __call__(self, state: RetryCallState) -> float:
        delay = float(self._exponential(state))
        asked = self._retry_after(state)
        if asked is not None:
            delay = max(delay, min(asked, MAX_RETRY_AFTER))
        return delay


def forever(
    retry: retry_base,
    initial: float,
    maximum: float,
    retry_after: Callable[[RetryCallState], float | None],
    *,
    sleep: Callable[[float], Awaitable[None]],
    before_sleep: Callable[[RetryCallState], Awaitable[None] | None],
) -> AsyncRetrying:
    """Retry while `retry` says so, never giving up, waiting by this policy (the metadata
    client, a sink's deliveries and the dispatcher's spool access all use it)."""
    return AsyncRetrying(
        retry=retry,
        wait=Backoff(initial, maximum, retry_after),
        stop=stop_never,
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )


def retry_logger(
    logger: logging.Logger,
    what: str,
    *,
    level: int = logging.ERROR,
    quiet: int | None = None,
    loud: Collection[int] = (1,),
    every: int = 0,
    reason: Callable[[RetryCallState], object] | None = None,
    traceback: bool = False,
) -> Callable[[RetryCallState], None]:
    """The one retry log line: "<what> (attempt N), retrying in <delay>: <error>".

    Without `quiet` every attempt logs at `level`; with it, only the attempts in `loud` and
    every `every`-th do, the others at `quiet` (a retry storm does not flood the log, and a
    long outage still shows now and then). `reason` says what failed when it is not the
    exception (a sink's `Retry` result); `traceback` adds the exception's traceback (an
    unexpected failure, such as a watcher's bug).
    """

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        attempt = state.attempt_number
        shown = quiet is None or attempt in loud or (every > 0 and attempt % every == 0)
        logger.log(
            level if shown or quiet is None else quiet,
            "%s (attempt %d), retrying in %s: %s",
            what,
            attempt,
            for_humans(delay),
            exc if reason is None else reason(state),
            exc_info=exc if traceback else None,
        )

    return before_sleep


def _no_retry_after(_state: RetryCallState) -> float | None:
    """A failure of our own asks for no particular wait: the policy's delay applies."""
    return None


async def retry_until_done(
    call: Callable[[], Awaitable[T]],
    *,
    retry_on: type[Exception] | tuple[type[Exception], ...],
    initial: float,
    maximum: float,
    before_sleep: Callable[[RetryCallState], None],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    retry_after: Callable[[RetryCallState], float | None] = _no_retry_after,
) -> T:
    """`call` until it returns, retried on `retry_on` by this policy: the helper of every
    loop that must not give up (spooling a notice, recording an action, an approval,
    detecting the cloud, the dispatcher's spool access, a metadata request). Cancellation
    ends it; another exception propagates. `retry_after` reads a wait the failure asks for
    (a metadata server's Retry-After); by default the policy's delay applies.

    The first attempt runs bare: these calls sit on hot paths (every notice's commit, every
    window the dispatcher reads) and nearly always succeed, and building tenacity's retry
    state costs more than some of the calls it wraps. Only a failure enters the retry loop,
    which counts it as attempt 1 (the same delays and log lines as without the shortcut).
    """
    try:
        return await call()
    except retry_on as exc:
        first: list[Exception] = [exc]

    async def attempt() -> T:
        if first:
            raise first.pop()
        return await call()

    retry = retry_if_exception_type(retry_on)
    retrying = forever(retry, initial, maximum, retry_after, sleep=sleep, before_sleep=before_sleep)
    # Not `await retrying(call)`: tenacity runs a plain function (a lambda returning a
    # coroutine) without awaiting what it returns.
    async for tried in retrying:
        with tried:
            return await attempt()
    raise AssertionError("unreachable: stop_never")  # pragma: no cover


def retry_for(
    call: Callable[[], T],
    *,
    seconds: float,
    retry_on: type[Exception] | tuple[type[Exception], ...],
    when: Callable[[Exception], bool] = lambda _exc: True,
    initial: float,
    maximum: float,
    before_sleep: Callable[[RetryCallState], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`call` (blocking) until it returns, retried on `retry_on` (and only when `when` says
    so of the exception) by this policy for at most `seconds`, then the last failure is
    raised: the sync sibling of `retry_until_done`, for a call on a worker thread that must
    give up in bounded time (the fleet's SQLite switch to WAL waits as long as a busy write
    would). Another exception propagates at once. The first attempt runs bare, as in
    `retry_until_done`."""
    try:
        return call()
    except retry_on as exc:
        if not when(exc):
            raise
        first: list[Exception] = [exc]

    def attempt() -> T:
        if first:
            raise first.pop()
        return call()

    def worth_retrying(exc: BaseException) -> bool:
        return isinstance(exc, retry_on) and when(exc)

    retrying = Retrying(
        retry=retry_if_exception(worth_retrying),
        wait=Backoff(initial, maximum, _no_retry_after),
        stop=stop_after_delay(seconds),
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
    return retrying(attempt)


async def keep_running(
    run: Callable[[Callable[[], None]], Awaitable[object]],
    *,
    retry_on: type[Exception] | tuple[type[Exception], ...],
    initial: float,
    maximum: float,
    before_sleep: Callable[[RetryCallState], None],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> NoReturn:
    """Run `run` again and again, forever: the supervisor of a long-lived task (a watcher).

    After a failure (`retry_on`) `run` starts again by this policy's delay, growing with
    each failure in a row; `run` is handed a function to call when it made progress (a
    watcher committed an update), and the failure after progress counts as a first failure
    again, so the delay starts over at `initial`. A `run` that returns starts again at once.
    Cancellation ends it; another exception propagates.
    """
    carried: Exception | None = None  # a failure after progress, to start the count over
    progressed = False

    def progress() -> None:
        nonlocal progressed
        progressed = True

    async def attempt() -> None:
        nonlocal carried, progressed
        progressed = False
        if carried is not None:  # a fresh count's attempt 1 is that failure
            failure, carried = carried, None
            raise failure
        await run(progress)

    def worth_retrying(exc: BaseException) -> bool:
        return isinstance(exc, retry_on) and not progressed

    while True:
        retry = retry_if_exception(worth_retrying)
        retrying = forever(
            retry, initial, maximum, _no_retry_after, sleep=sleep, before_sleep=before_sleep
        )
        try:
            async for tried in retrying:
                with tried:
                    await attempt()
        except retry_on as exc:  # not retried: it failed after progress
            carried = exc


def for_humans(seconds: float) -> str:
    """A delay as a log line says it: "0.5s", "12s" (never "0s" for a half-second backoff)."""
    if seconds < 1:
        return f"{seconds:.2g}s"
    if seconds < 10:
        return f"{seconds:.1f}s".replace(".0s", "s")
    return f"{seconds:.0f}s"


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header (delta-seconds or an HTTP date) as seconds from now; None when
    absent or unreadable (the policy's own delay then applies)."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = parse_time(value)  # an HTTP date; one without a zone is UTC
    except TimeParseError:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
