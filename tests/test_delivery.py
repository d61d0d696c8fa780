"""The spool and the dispatcher: at-least-once, in order, dead letters, independent sinks."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from cloudevents.core.v1.event import CloudEvent

from bridge.pipeline import spool as spool_module
from bridge.pipeline import spool_outbox, spool_records
from bridge.pipeline.dispatch import READ_AHEAD, Dispatcher
from bridge.pipeline.events import serialize
from bridge.pipeline.spool import DB_NAME, NewEvent, Spool, SpoolError
from bridge.sinkapi import Reject, Result, Retry
from sinks.memory import MemorySink
from tests.factories import instance, sample_events
from tests.support import eventually


def rows(events: Sequence[CloudEvent]) -> list[NewEvent]:
    return [NewEvent(e.get_id(), e.get_source(), e.get_type(), serialize(e)) for e in events]


@pytest.fixture
async def spool(tmp_path: Path) -> AsyncIterator[Spool]:
    spool = Spool(tmp_path, ["a", "b"])
    await spool.open()
    yield spool
    await spool.close()


class Sleeps:
    """Records the backoff the dispatcher asks for instead of waiting it out."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)
        await asyncio.sleep(0)


async def drain(
    spool: Spool, sinks: Sequence[MemorySink], sleep: Sleeps | None = None, count: int = 0
) -> Dispatcher:
    """Run a dispatcher until the first sink holds `count` events (the others as many as
    they were due), then stop it."""
    dispatcher = Dispatcher(spool, sinks, retry_initial=0.5, retry_max=8, sleep=sleep)
    dispatcher.start()
    dispatcher.notify()
    await sinks[0].wait_for(count, timeout=5)
    await dispatcher.stop(1.0)
    return dispatcher


async def test_committed_events_are_delivered_in_order_then_removed(spool: Spool) -> None:
    events = sample_events(6)
    assert len(await spool.commit(rows(events))) == 6
    a, b = MemorySink("a"), MemorySink("b")
    await drain(spool, [a, b], count=6)
    assert [e.get_id() for e in a.events] == [e.get_id() for e in events]
    assert [e.get_id() for e in b.events] == [e.get_id() for e in events]
    assert await spool.depth() == {}


async def test_a_duplicate_id_is_spooled_once(spool: Spool) -> None:
    (event,) = sample_events(1)
    assert len(await spool.commit(rows([event]))) == 1
    assert await spool.commit(rows([event])) == []
    assert (await spool.depth())["a"][0] == 1


async def test_transient_failures_are_retried_with_backoff_and_retry_after(spool: Spool) -> None:
    await spool.commit(rows(sample_events(1)))
    a, b = MemorySink("a"), MemorySink("b")
    a.fail_next(Retry("503"), Retry("429", after=30.0), Retry("timeout"))
    sleeps = Sleeps()
    dispatcher = await drain(spool, [a, b], sleeps, count=1)
    assert len(a.events) == 1
    assert a.attempts == 4
    assert len(sleeps.asked) == 3
    assert sleeps.asked[1] >= 30.0  # Retry-After is a floor
    assert sleeps.asked[0] <= 1.0
    assert sleeps.asked[2] <= 8.0
    assert dispatcher.stats["a"].retried == 3


async def test_a_dead_sink_holds_back_nobody_else(spool: Spool) -> None:
    await spool.commit(rows(sample_events(4)))
    dead, alive = MemorySink("a"), MemorySink("b")
    dead.fail_next(*[Retry("connection refused")] * 1000)
    dispatcher = Dispatcher(spool, [dead, alive], retry_initial=0.01, retry_max=0.02)
    dispatcher.start()
    dispatcher.notify()
    await alive.wait_for(4)
    await dispatcher.stop(0.5)
    assert dead.events == []
    depth = await spool.depth()
    assert depth["a"][0] == 4
    assert "b" not in depth


async def test_rejected_event_is_dead_lettered_and_replayable(spool: Spool) -> None:
    events = sample_events(3)
    await spool.commit(rows(events))
    a, b = MemorySink("a"), MemorySink("b")
    a.fail_next(Reject("HTTP 400 bad request"))
    a.max_batch = 1  # type: ignore[misc]
    await drain(spool, [a, b], count=2)
    letters = await spool.dead_letters()
    assert [(d.sink, d.id, d.reason) for d in letters] == [
        ("a", events[0].get_id(), "HTTP 400 bad request")
    ]
    assert await spool.replay("a") == 1
    again = MemorySink("a")
    await drain(spool, [again, MemorySink("b")], count=1)
    assert [e.get_id() for e in again.events] == [events[0].get_id()]
    assert await spool.dead_letters() == []


async def test_one_poisonous_event_does_not_condemn_its_batch(spool: Spool) -> None:
    events = sample_events(3)
    await spool.commit(rows(events))

    class Picky(MemorySink):
        async def _publish(self, batch: Sequence[CloudEvent]) -> Result:
            if any(e.get_id() == events[1].get_id() for e in batch):
                return Reject("too large")
            return await super()._publish(batch)

    picky = Picky("a")
    await drain(spool, [picky, MemorySink("b")], count=2)
    assert [e.get_id() for e in picky.events] == [events[0].get_id(), events[2].get_id()]
    assert [d.id for d in await spool.dead_letters("a")] == [events[1].get_id()]


async def test_purge_deletes_dead_letters_for_good(spool: Spool) -> None:
    await spool.commit(rows(sample_events(1)))
    a = MemorySink("a")
    a.fail_next(Reject("HTTP 404"))
    await drain(spool, [a, MemorySink("b")], count=0)
    assert await spool.purge() == 1
    assert await spool.dead_letters() == []


async def test_a_sink_that_raises_is_retried_not_fatal(spool: Spool) -> None:
    await spool.commit(rows(sample_events(1)))

    class Buggy(MemorySink):
        calls = 0

        async def _publish(self, batch: Sequence[CloudEvent]) -> Result:
            Buggy.calls += 1
            if Buggy.calls == 1:
                raise RuntimeError("bug")
            return await super()._publish(batch)

    buggy = Buggy("a")
    await drain(spool, [buggy, MemorySink("b")], Sleeps(), count=1)
    assert len(buggy.events) == 1


async def test_order_per_instance_is_kept(spool: Spool) -> None:
    mixed = []
    for a, b in zip(
        sample_events(5, instance("vm-a")), sample_events(5, instance("vm-b")), strict=True
    ):
        mixed += [a, b]
    await spool.commit(rows(mixed))
    sink = MemorySink("a")
    sink.fail_next(Retry("blip"))
    await drain(spool, [sink, MemorySink("b")], Sleeps(), count=10)
    for vm in ("vm-a", "vm-b"):
        got = [e.get_id() for e in sink.events if e.get_subject() == vm]
        assert got == [e.get_id() for e in mixed if e.get_subject() == vm]


async def test_nothing_is_sent_before_the_commits_fsync_and_commit_returns_after_it(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatcher is woken only once the commit is fsynced, and `commit` returns only
    then (the watcher's checkpoint is acknowledged exactly as late as before). The test
    holds the data sync back: a disk that is slow on demand cannot be had here."""
    entered, release = threading.Event(), threading.Event()
    sync = spool_module._sync_data

    def held_sync(fd: int) -> None:
        entered.set()
        release.wait(10)
        sync(fd)

    monkeypatch.setattr(spool_module, "_sync_data", held_sync)
    sink = MemorySink("a")
    dispatcher = Dispatcher(spool, [sink, MemorySink("b")])
    dispatcher.start()
    commit = asyncio.create_task(spool.commit(rows(sample_events(1)), {"gce": {"n": 1}}))
    try:
        await eventually(entered.is_set)
        await asyncio.sleep(0.05)  # room for a wrong early send to show
        assert sink.events == []
        assert not commit.done()
    finally:
        release.set()
    assert len(await commit) == 1
    await sink.wait_for(1)
    await dispatcher.stop(1.0)
    assert await spool.load_checkpoint("gce") == {"n": 1}


async def test_a_failed_fsync_fails_the_commit_and_holds_its_events_until_one_succeeds(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transaction is written but not durable: `commit` raises, nothing is sent, and
    the watcher's retry of the same commit (same ids, ignored) fsyncs and releases it.
    A failing disk cannot be had here: the data sync raises what a failing disk raises."""
    sync = spool_module._sync_data
    failures = [OSError(5, "Input/output error")]

    def failing_sync(fd: int) -> None:
        if failures:
            raise failures.pop()
        sync(fd)

    monkeypatch.setattr(spool_module, "_sync_data", failing_sync)
    sink = MemorySink("a")
    dispatcher = Dispatcher(spool, [sink, MemorySink("b")])
    dispatcher.start()
    dispatcher.notify()
    spooled = rows(sample_events(1))
    with pytest.raises(SpoolError, match="Input/output error"):
        await spool.commit(spooled, {"gce": {"n": 1}})
    assert spool.writes.failing_since is not None
    dispatcher.notify()  # a worker that reads the written event must still hold it
    await asyncio.sleep(0.05)
    assert sink.events == []
    assert await spool.commit(spooled, {"gce": {"n": 1}}) == []  # the retry: same id
    await sink.wait_for(1)
    assert spool.writes.failing_since is None
    await dispatcher.stop(1.0)


async def test_a_waiting_worker_takes_its_window_from_the_commit(spool: Spool) -> None:
    """An idle worker does not read the spool again for a new event: the commit read its
    window on the spool's thread, right after the transaction (one trip, not three). A
    window read that way is dropped by any other write, so what it holds is never stale."""
    reads: list[str] = []
    run = spool._run

    async def counted(fn: Any, **kwargs: Any) -> Any:
        if getattr(fn, "func", None) is spool_outbox.pending:
            reads.append(fn.keywords["sink"])
        return await run(fn, **kwargs)

    spool._run = counted  # type: ignore[method-assign]

    class Noting(MemorySink):
        reads_when_sent: ClassVar[list[int]] = []

        async def _publish(self, batch: Sequence[CloudEvent]) -> Result:
            self.reads_when_sent.append(reads.count("a"))
            return await super()._publish(batch)

    sink = Noting("a")
    dispatcher = Dispatcher(spool, [sink, MemorySink("b")])
    dispatcher.start()
    await eventually(lambda: reads.count("a") == 1)  # the first read found nothing
    await eventually(lambda: "a" in spool._waiting)
    events = sample_events(3)
    await spool.commit(rows(events[:1]))
    await sink.wait_for(1)
    assert sink.reads_when_sent == [1]  # sent without a read of its own: it came with the commit
    await eventually(lambda: "a" in spool._waiting)  # idle again, acknowledged
    spool._prefetched["a"] = (READ_AHEAD, [])  # a window that a write makes stale...
    await spool.ack("b", [])  # ...is dropped by that write
    assert "a" not in spool._prefetched
    await spool.commit(rows(events[1:]))
    await sink.wait_for(3)
    assert [e.get_id() for e in sink.events] == [e.get_id() for e in events]
    await dispatcher.stop(1.0)


async def test_the_next_window_goes_out_while_an_acknowledgement_is_held_up(
    spool: Spool, tmp_path: Path
) -> None:
    """Window N+1 is sent while window N's acknowledgements are written. Here that write is
    held up (another writer holds the spool's lock, as a stuck disk would): the next window
    still goes out, the held acknowledgement is retried, never re-sent, and in the end
    every event reached the sink once, in order, and left the queue."""
    events = sample_events(2 * READ_AHEAD + 10)
    await spool.commit(rows(events))
    await spool._run(lambda db: db.execute("PRAGMA busy_timeout=50"))
    blocker = sqlite3.connect(tmp_path / DB_NAME, isolation_level=None)

    class LocksAfterTheFirstWindow(MemorySink):
        locked = False

        async def _publish(self, batch: Sequence[CloudEvent]) -> Result:
            result = await super()._publish(batch)
            if len(self.events) >= READ_AHEAD and not self.locked:
                blocker.execute("BEGIN IMMEDIATE")
                self.locked = True
            return result

    sink = LocksAfterTheFirstWindow("a")
    dispatcher = Dispatcher(spool, [sink, MemorySink("b")], sleep=Sleeps())
    dispatcher.start()
    dispatcher.notify()
    try:
        await sink.wait_for(2 * READ_AHEAD)  # the second window went out meanwhile
        assert dispatcher.stats["a"].delivered < 2 * READ_AHEAD  # not all acknowledged yet
    finally:
        blocker.rollback()
        blocker.close()
    await eventually(lambda: dispatcher.stats["a"].delivered == len(events))
    await dispatcher.stop(1.0)
    assert [e.get_id() for e in sink.events] == [e.get_id() for e in events]  # once, in order
    assert "a" not in await spool.depth()


async def test_stop_returns_within_the_deadline_and_keeps_the_backlog(spool: Spool) -> None:
    await spool.commit(rows(sample_events(50)))

    class Slow(MemorySink):
        max_batch = 1

        async def _publish(self, batch: Sequence[CloudEvent]) -> Result:
            await asyncio.sleep(0.05)
            return await super()._publish(batch)

    slow = Slow("a")
    dispatcher = Dispatcher(spool, [slow, MemorySink("b")])
    dispatcher.start()
    dispatcher.notify()
    await slow.wait_for(3)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await dispatcher.stop(0.3)
    assert loop.time() - started < 1.0
    delivered = len(slow.events)
    assert delivered < 50
    assert (await spool.depth())["a"][0] == 50 - delivered  # the rest is kept, none lost


async def test_an_acknowledgement_larger_than_a_statement_takes_every_event_out(
    spool: Spool,
) -> None:
    """Acknowledgements are written a chunk of events per statement: one past the chunk size
    leaves nothing behind, and a body another sink still waits for is kept."""
    count = spool_records.CHUNK * 2 + 1
    seqs = await spool.commit(rows(sample_events(count)))
    await spool.ack("a", seqs)
    depth = await spool.depth()
    assert "a" not in depth
    assert depth["b"][0] == count
    assert [e.seq for e in await spool.pending("b", limit=count)] == seqs  # bodies kept for b
    await spool.ack("b", seqs[1:])
    assert [e.seq for e in await spool.pending("b", limit=count)] == seqs[:1]
    bodies = await spool._run(lambda db: db.execute("SELECT COUNT(*) FROM events").fetchone()[0])
    assert bodies == 1  # the others no sink needs any more


async def test_acknowledgements_checkpoint_the_wal_so_notices_stop_growing_it(
    tmp_path: Path,
) -> None:
    """A notice's fdatasync is cheaper into blocks the WAL already has than one that grows
    the file: acknowledgements (off the notices' way) checkpoint it early, after which
    SQLite writes it from its beginning again, and its size stays put."""
    spool = Spool(tmp_path, ["a"])
    await spool.open()
    wal = tmp_path / (DB_NAME + "-wal")
    sizes = []
    try:
        for n, event in enumerate(rows(sample_events(60))):
            seqs = await spool.commit([event], {"gce": {"n": n}}, in_force={str(n): event.body})
            await spool.ack("a", seqs)
            sizes.append(wal.stat().st_size)
    finally:
        await spool.close()
    frame = 4096 + 24
    assert sizes[29] < (spool_outbox.ACK_CHECKPOINT_FRAMES + 100) * frame
    assert sizes[-1] == sizes[29]  # no notice after the first checkpoints made it grow


async def test_a_drains_acknowledgements_leave_the_checkpoints_to_sqlite(spool: Spool) -> None:
    """A drain's windows are acknowledged many events at a time while the next window is
    sent: a checkpoint there (two fsyncs) would hold up the worker, so they checkpoint at
    SQLite's own 1,000 frames, like the notices' commits; a notice's acknowledgement early."""

    async def checkpoints_at() -> int:
        return int(
            await spool._run(lambda db: db.execute("PRAGMA wal_autocheckpoint").fetchone()[0])
        )

    seqs = await spool.commit(rows(sample_events(spool_outbox.FEW_EVENTS + 1)))
    await spool.ack("a", seqs[:1])
    assert await checkpoints_at() == spool_outbox.ACK_CHECKPOINT_FRAMES
    await spool.ack("a", seqs[1:])
    assert await checkpoints_at() == spool_outbox.COMMIT_CHECKPOINT_FRAMES
    await spool.commit(rows(sample_events(1)))
    assert await checkpoints_at() == spool_outbox.COMMIT_CHECKPOINT_FRAMES


async def test_checkpoint_and_events_commit_together(spool: Spool) -> None:
    await spool.commit(rows(sample_events(1)), {"gce": {"instance/maintenance-event": {"v": 1}}})
    assert await spool.load_checkpoint("gce") == {"instance/maintenance-event": {"v": 1}}
    assert await spool.load_checkpoint("azure") is None


async def test_a_full_queue_moves_the_oldest_to_dead_letters_never_deletes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path, ["a"], max_pending=3)
    await spool.open()
    try:
        events = sample_events(5)
        for event in events:
            await spool.commit(rows([event]))
        assert (await spool.depth())["a"][0] == 3
        letters = await spool.dead_letters("a")
        assert [d.id for d in letters] == [e.get_id() for e in events[:2]]  # the oldest two
        assert all(d.reason.startswith("spool full") for d in letters)
        assert spool.overflowed == {"a": 2}
        assert "moved to the dead letters" in caplog.text
        assert await spool.replay("a") == 2  # nothing was lost: all five can be delivered
    finally:
        await spool.close()


async def test_disk_full_is_a_clear_error_and_stores_nothing_half(tmp_path: Path) -> None:
    from bridge.pipeline.spool import SpoolError

    spool = Spool(tmp_path, ["a"])
    await spool.open()
    try:
        await spool.commit(rows(sample_events(1)), {"gce": {"v": 1}})
        # Make SQLite's file unable to grow, as on a full disk (SQLITE_FULL).
        pages = await spool._run(lambda db: db.execute("PRAGMA page_count").fetchone()[0])
        await spool._run(lambda db: db.execute(f"PRAGMA max_page_count={pages}"))
        big = [NewEvent(f"id-{i}", "src", "type", b"x" * 100_000) for i in range(20)]
        with pytest.raises(SpoolError, match="disk full"):
            await spool.commit(big, {"gce": {"v": 2}})
        assert await spool.load_checkpoint("gce") == {"v": 1}  # rolled back together
        assert (await spool.depth())["a"][0] == 1
        await spool._run(lambda db: db.execute("PRAGMA max_page_count=1073741823"))
        assert len(await spool.commit(big, {"gce": {"v": 2}})) == 20  # retried: it works
    finally:
        await spool.close()
