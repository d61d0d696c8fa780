"""The outbox proper: the events and, per sink, the queue of those it has not acknowledged.

An event is pending once per sink configured when it was committed, and leaves a sink's
queue only when that sink acknowledged it (`ack`) or rejected it for good (a dead letter,
`spool_dead_letters`). Sinks are independent: a dead webhook holds back nobody else. Within
a sink events are handed out oldest first (by `seq`), the order the watchers observed them,
so per-instance order holds. Duplicate ids are ignored on insert, so a transition is
spooled once however often it is announced.

Each function here is one transaction (or one read) on the spool's connection, run on its
thread; how durable each write is stands beside it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any, Final

from bridge.infra.sqlparams import chunks, marks
from bridge.pipeline import spool_state
from bridge.pipeline.spool_dead_letters import bound_queues, collect
from bridge.pipeline.spool_records import CHUNK, NewEvent, Spooled

#: WAL frames past which a commit checkpoints the WAL into the database file: a notice's
#: commit and a drain's acknowledgements only when the WAL is this long (SQLite's default),
#: the acknowledgement of a few events (notices arriving one by one) already from
#: `ACK_CHECKPOINT_FRAMES` on.
COMMIT_CHECKPOINT_FRAMES: Final = 1000
#: After a checkpoint SQLite writes the WAL from its beginning again, into blocks the file
#: already has: the fdatasync of a notice's commit then writes its data alone, where one
#: that makes the file grow also commits the file system's journal (its size, its blocks;
#: 40 KiB and an fdatasync alone on a busy 2-core VM's ext4, p50: 2.7 to 2.9 ms rewritten
#: in place, 3.9 to 4.9 ms appended; `bench.drain.disk_floor`). The acknowledgement of a
#: notice is written after its delivery, off every notice's way, so it takes the
#: checkpoints, and soon: the WAL stops growing within the first few dozen notices after a
#: start. A drain's acknowledgements do not: their checkpoints (two fsyncs each) held up
#: the next window's read and acknowledgement.
ACK_CHECKPOINT_FRAMES: Final = 256
#: An acknowledgement of fewer events than this is a notice's, not a drain's.
FEW_EVENTS: Final = 16


def commit(
    db: sqlite3.Connection,
    now: float,
    events: Sequence[NewEvent],
    sinks: Sequence[str],
    max_pending: int,
    *,
    checkpoints: Mapping[str, Any],
    plan: Mapping[str, str],
    states: Mapping[str, str],
    in_force: Mapping[str, bytes | None],
) -> tuple[list[int], dict[str, int]]:
    """Add the new events to every sink's queue, with the state that goes with them, in one
    transaction written with `synchronous=NORMAL` (the caller fsyncs it: `Spool.commit`).
    Return the new seqs and the events per sink moved to the dead letters by the bound."""
    added: list[int] = []
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(f"PRAGMA wal_autocheckpoint={COMMIT_CHECKPOINT_FRAMES}")
    db.execute("BEGIN IMMEDIATE")
    for event in events:
        cursor = db.execute(
            "INSERT OR IGNORE INTO events (id, source, type, created, body) VALUES (?, ?, ?, ?, ?)",
            (event.id, event.source, event.type, now, event.body),
        )
        if cursor.rowcount:
            seq = cursor.lastrowid
            assert seq is not None
            added.append(seq)
            db.executemany(
                "INSERT INTO pending (sink, seq) VALUES (?, ?)", [(s, seq) for s in sinks]
            )
    spool_state.write(db, now, checkpoints, plan, states, in_force)
    overflow = bound_queues(db, sinks, max_pending, now) if added else {}
    db.execute("COMMIT")
    return added, overflow


def ack(db: sqlite3.Connection, sink: str, seqs: Sequence[int]) -> None:
    """Take events out of `sink`'s queue and drop the bodies nobody needs any more.

    Written with `synchronous=NORMAL`: an ack lost in a power cut only means one more
    delivery of an event with the same id (at-least-once), never a loss, and it keeps the
    drain rate high.

    One statement per `CHUNK` events, not one per event: the dispatcher writes a window's
    acknowledgements while it sends the next window, and every statement SQLite steps
    hands the GIL to the event loop and back, a thread switch each way that the loop's
    sends then wait for (about a quarter of a drain's time per event before).

    The acknowledgement of a few events checkpoints the WAL once it holds
    `ACK_CHECKPOINT_FRAMES`, so that the notices' commits write into a WAL that no longer
    grows."""
    few = len(seqs) < FEW_EVENTS
    frames = ACK_CHECKPOINT_FRAMES if few else COMMIT_CHECKPOINT_FRAMES
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(f"PRAGMA wal_autocheckpoint={frames}")
    db.execute("BEGIN IMMEDIATE")
    for chunk in chunks(seqs, CHUNK):
        db.execute(
            f"DELETE FROM pending WHERE sink = ? AND seq IN ({marks(len(chunk))})",  # noqa: S608
            (sink, *chunk),
        )
    collect(db, seqs)
    db.execute("COMMIT")


def record_attempt(db: sqlite3.Connection, sink: str, seqs: Sequence[int], error: str) -> None:
    """Count one more failed attempt (and its error) for events still in `sink`'s queue."""
    db.execute("PRAGMA synchronous=NORMAL")
    db.executemany(
        "UPDATE pending SET attempts = attempts + 1, last_error = ? WHERE sink = ? AND seq = ?",
        [(error, sink, s) for s in seqs],
    )


def pending(db: sqlite3.Connection, sink: str, limit: int, after: int) -> list[Spooled]:
    """The oldest events in `sink`'s queue after seq `after`, at most `limit`."""
    rows = db.execute(
        "SELECT e.seq, e.id, e.body, p.attempts FROM pending p "
        "JOIN events e ON e.seq = p.seq WHERE p.sink = ? AND p.seq > ? "
        "ORDER BY p.seq LIMIT ?",
        (sink, after, limit),
    ).fetchall()
    return [Spooled(seq, id_, bytes(body), attempts) for seq, id_, body, attempts in rows]


def depth(db: sqlite3.Connection) -> dict[str, tuple[int, float | None]]:
    """Per sink: pending count and the creation time of its oldest pending event."""
    rows = db.execute(
        "SELECT p.sink, COUNT(*), MIN(e.created) FROM pending p "
        "JOIN events e ON e.seq = p.seq GROUP BY p.sink"
    ).fetchall()
    return {sink: (count, oldest) for sink, count, oldest in rows}
