"""The one retry helper (`bridge.infra.backoff.retry_until_done`) and its one log line
(`retry_logger`), used by every loop that must not give up: spooling a notice, recording an
action, an approval, detecting the cloud, the metadata client and the dispatcher's spool;
and its blocking sibling `retry_for` (a bounded time: the fleet's SQLite switch to WAL)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import NoReturn

import pytest
from tenacity import retry_if_result

from bridge.infra.backoff import (
    forever,
    keep_running,
    retry_for,
    retry_logger,
    retry_until_done,
)

log = logging.getLogger("tests.retry")


class Flaky:
    """Fails `failures` times with `error`, then answers "done"."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "done"


async def test_retries_until_the_call_returns_waiting_longer_each_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    waits: list[float] = []

    async def sleep(delay: float) -> None:
        waits.append(delay)

    call = Flaky(4, OSError("disk full"))
    caplog.set_level(logging.INFO, logger="tests.retry")
    result = await retry_until_done(
        call,
        retry_on=OSError,
        initial=0.5,
        maximum=3.0,
        before_sleep=retry_logger(log, "cannot spool 1 notice(s)"),
        sleep=sleep,
    )
    assert (result, call.calls) == ("done", 5)
    assert len(waits) == 4
    assert all(0.5 <= w <= 3.0 for w in waits)
    assert waits[-1] > waits[0]  # exponential, capped; jitter never undoes the doubling here
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("cannot spool 1 notice(s) (attempt 1), retrying in ")
    assert lines[0].endswith(": disk full")
    assert len(lines) == 4


async def test_another_error_is_not_retried() -> None:
    async def sleep(delay: float) -> None:
        raise AssertionError("no wait expected")

    with pytest.raises(ValueError, match="bad"):
        await retry_until_done(
            Flaky(1, ValueError("bad")),
            retry_on=OSError,
            initial=0.1,
            maximum=1.0,
            before_sleep=retry_logger(log, "x"),
            sleep=sleep,
        )


async def test_a_quiet_logger_speaks_up_on_the_loud_attempts_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def sleep(delay: float) -> None:
        pass

    caplog.set_level(logging.DEBUG, logger="tests.retry")
    await retry_until_done(
        Flaky(12, OSError("down")),
        retry_on=OSError,
        initial=0.01,
        maximum=0.02,
        before_sleep=retry_logger(
            log,
            "metadata request failed",
            level=logging.WARNING,
            quiet=logging.DEBUG,
            loud=(1, 5),
            every=10,
        ),
        sleep=sleep,
    )
    loud = [
        r.getMessage().split(" (attempt ")[1].split(")")[0]
        for r in caplog.records
        if r.levelno == logging.WARNING
    ]
    assert loud == ["1", "5", "10"]
    assert len(caplog.records) == 12


class Supervised:
    """A long-lived task for `keep_running`: each run follows the next script entry.

    "fail": fails at once; "progress-fail": reports progress, then fails; "return": returns;
    "stop": raises an error `keep_running` does not retry (ends the test)."""

    def __init__(self, *script: str) -> None:
        self.script = list(script)
        self.runs = 0

    async def __call__(self, progressed: Callable[[], None]) -> None:
        self.runs += 1
        step = self.script.pop(0)
        if step == "progress-fail":
            progressed()
        if step in ("fail", "progress-fail"):
            raise OSError(f"run {self.runs} failed")
        if step == "stop":
            raise ValueError("end of script")


def _keep_running(
    run: Callable[[Callable[[], None]], Awaitable[None]], sleep: Callable[[float], Awaitable[None]]
) -> Coroutine[None, None, NoReturn]:
    """`keep_running` as the runner uses it: from 1 s to 60 s, tracebacks logged."""
    before_sleep = retry_logger(log, "worker failed", traceback=True)
    return keep_running(
        run, retry_on=OSError, initial=1.0, maximum=60.0, before_sleep=before_sleep, sleep=sleep
    )


async def _supervise(task: Supervised, caplog: pytest.LogCaptureFixture) -> list[float]:
    waits: list[float] = []

    async def sleep(delay: float) -> None:
        waits.append(delay)

    caplog.set_level(logging.INFO, logger="tests.retry")
    with pytest.raises(ValueError, match="end of script"):
        await _keep_running(task, sleep)
    return waits


async def test_keep_running_restarts_a_failing_task_doubling_its_delay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    task = Supervised(*["fail"] * 8, "stop")
    waits = await _supervise(task, caplog)
    assert task.runs == 9
    assert len(waits) == 8
    for attempt, wait in enumerate(waits[:5]):  # 1, 2, 4, 8, 16 s plus up to 1 s of jitter
        assert 2**attempt <= wait <= 2**attempt + 1
    assert all(wait <= 60.0 for wait in waits)
    assert waits[-1] == 60.0  # 128 s capped
    first = caplog.records[0]
    assert first.getMessage().startswith("worker failed (attempt 1), retrying in ")
    assert first.getMessage().endswith(": run 1 failed")
    assert first.exc_info is not None  # the traceback of an unexpected failure


async def test_keep_running_starts_the_delay_over_after_progress(
    caplog: pytest.LogCaptureFixture,
) -> None:
    task = Supervised("fail", "fail", "fail", "progress-fail", "fail", "stop")
    waits = await _supervise(task, caplog)
    assert task.runs == 6
    assert [int(w) for w in waits] == [1, 2, 4, 1, 2]  # jitter adds less than a second
    attempts = [r.getMessage().split(" (attempt ")[1].split(")")[0] for r in caplog.records]
    assert attempts == ["1", "2", "3", "1", "2"]
    assert caplog.records[3].getMessage().endswith(": run 4 failed")


async def test_keep_running_restarts_a_task_that_returns_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    task = Supervised("return", "return", "fail", "stop")
    waits = await _supervise(task, caplog)
    assert task.runs == 4
    assert len(waits) == 1


async def test_keep_running_ends_when_cancelled() -> None:
    started = asyncio.Event()

    async def endless(progressed: Callable[[], None]) -> None:
        started.set()
        await asyncio.Event().wait()

    async def sleep(delay: float) -> None:
        raise AssertionError("a cancellation is not retried")

    supervisor = asyncio.create_task(_keep_running(endless, sleep))
    await started.wait()
    supervisor.cancel()
    with pytest.raises(asyncio.CancelledError):
        await supervisor


async def test_the_reason_can_be_a_result_rather_than_an_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The dispatcher retries on a sink's `Retry` answer, a result: its reason is logged."""
    answers = iter(["busy", "busy", "done"])

    async def sleep(delay: float) -> None:
        pass

    caplog.set_level(logging.INFO, logger="tests.retry")
    retrying = forever(
        retry_if_result(lambda answer: answer != "done"),
        0.01,
        0.02,
        lambda _state: None,
        sleep=sleep,
        before_sleep=retry_logger(
            log,
            "sink memory: 1 event(s) not delivered",
            reason=lambda state: f"receiver {state.outcome.result() if state.outcome else '?'}",
        ),
    )

    async def attempt() -> str:
        return next(answers)

    assert await retrying(attempt) == "done"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("sink memory: 1 event(s) not delivered (attempt 1), retrying in ")
    assert lines[0].endswith(": receiver busy")


# -- the blocking sibling: `retry_for` ---------------------------------------------------------


class FlakySync:
    """Fails `failures` times with `error`, then answers "done" (blocking)."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "done"


def test_retry_for_retries_a_blocking_call_by_the_same_policy() -> None:
    waits: list[float] = []
    call = FlakySync(4, OSError("database is locked"))
    result = retry_for(
        call, seconds=60, retry_on=OSError, initial=0.5, maximum=3.0, sleep=waits.append
    )
    assert (result, call.calls) == ("done", 5)
    assert len(waits) == 4
    assert all(0.5 <= w <= 3.0 for w in waits)
    assert waits[-1] > waits[0]  # the same exponential policy as `retry_until_done`


def test_retry_for_retries_only_what_the_predicate_accepts() -> None:
    call = FlakySync(1, OSError("disk I/O error"))
    with pytest.raises(OSError, match="disk I/O"):
        retry_for(
            call,
            seconds=60,
            retry_on=OSError,
            when=lambda exc: "locked" in str(exc),
            initial=0.01,
            maximum=0.1,
            sleep=lambda _delay: pytest.fail("no wait expected"),
        )
    assert call.calls == 1


def test_retry_for_gives_up_after_its_time_with_the_last_failure() -> None:
    call = FlakySync(1_000, OSError("database is locked"))
    began = time.monotonic()  # tenacity's stop reads the real clock: real (short) waits
    with pytest.raises(OSError, match="locked"):
        retry_for(call, seconds=0.2, retry_on=OSError, initial=0.01, maximum=0.05)
    assert 0.2 <= time.monotonic() - began < 2.0
    assert call.calls > 2


def test_retry_for_another_error_is_not_retried() -> None:
    with pytest.raises(ValueError, match="bad"):
        retry_for(
            FlakySync(1, ValueError("bad")),
            seconds=60,
            retry_on=OSError,
            initial=0.1,
            maximum=1.0,
            sleep=lambda _delay: pytest.fail("no wait expected"),
        )


def test_retry_for_logs_each_retry_with_the_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tests.retry")
    retry_for(
        FlakySync(2, OSError("database is locked")),
        seconds=60,
        retry_on=OSError,
        initial=0.01,
        maximum=0.1,
        before_sleep=retry_logger(log, "cannot switch to WAL"),
        sleep=lambda _delay: None,
    )
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("cannot switch to WAL (attempt 1), retrying in ")
