"""The one retry helper (`bridge.infra.backoff.retry_until_done`) and its one log line
(`retry_logger`), used by every loop that must not give up: spooling a notice, recording an
action, an approval, detecting the cloud, the metadata client and the dispatcher's spool."""

from __future__ import annotations

import logging

import pytest

from bridge.infra.backoff import retry_logger, retry_until_done

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
