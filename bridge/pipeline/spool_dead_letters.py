"""The spool's dead letters: events a sink refused for good, or that overflowed its queue.

A dead letter keeps its event and the reason until an operator replays it into its sink's
queue (`maintenance-bridge spool replay`) or purges it: nothing leaves the spool unseen.
A sink's queue is bounded (`delivery.max_pending`): beyond the bound the oldest waiting
events become dead letters with the reason `SPOOL_FULL`, so a sink back after a very long
outage is not flooded with stale notices ahead of current ones, and none is deleted.

Each function here is one transaction on the spool's connection, run on its thread.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Final

from bridge.infra.sqlparams import chunks, marks
from bridge.pipeline.spool_records import CHUNK, DeadLetter

DEFAULT_MAX_PENDING: Final = 100_000
SPOOL_FULL: Final = "spool full: more than delivery.max_pending events waiting for this sink"


def bound_queues(
    db: sqlite3.Connection, sinks: Sequence[str], max_pending: int, now: float
) -> dict[str, int]:
    """Inside the caller's transaction: move each sink's oldest waiting events beyond
    `max_pending` to the dead letters; return how many per sink that overflowed."""
    overflow: dict[str, int] = {}
    for sink in sinks:
        (count,) = db.execute("SELECT COUNT(*) FROM pending WHERE sink = ?", (sink,)).fetchone()
        if count > max_pending:
            oldest = db.execute(
                "SELECT seq FROM pending WHERE sink = ? ORDER BY seq LIMIT ?",
                (sink, count - max_pending),
            ).fetchall()
            db.executemany(
                "INSERT OR REPLACE INTO dead_letters (sink, seq, reason, attempts, at) "
                "SELECT sink, seq, ?, attempts, ? FROM pending WHERE sink = ? AND seq = ?",
                [(SPOOL_FULL, now, sink, seq) for (seq,) in oldest],
            )
            db.executemany(
                "DELETE FROM pending WHERE sink = ? AND seq = ?", [(sink, q) for (q,) in oldest]
            )
            overflow[sink] = len(oldest)
    return overflow


def collect(db: sqlite3.Connection, seqs: Sequence[int]) -> None:
    """Inside the caller's transaction: drop event bodies that no sink needs any more (not
    waiting in a queue, not kept as a dead letter); one statement per `CHUNK` events."""
    for chunk in chunks(seqs, CHUNK):
        db.execute(
            f"DELETE FROM events WHERE seq IN ({marks(len(chunk))}) "  # noqa: S608 (only ?s)
            "AND NOT EXISTS (SELECT 1 FROM pending WHERE pending.seq = events.seq) "
            "AND NOT EXISTS (SELECT 1 FROM dead_letters WHERE dead_letters.seq = events.seq)",
            chunk,
        )


def dead_letter(
    db: sqlite3.Connection, sink: str, seqs: Sequence[int], reason: str, now: float
) -> None:
    """Move events out of a sink's queue into the dead-letter table, with the reason."""
    db.execute("PRAGMA synchronous=FULL")
    db.execute("BEGIN IMMEDIATE")
    for seq in seqs:
        db.execute(
            "INSERT OR REPLACE INTO dead_letters (sink, seq, reason, attempts, at) "
            "SELECT sink, seq, ?, attempts + 1, ? FROM pending WHERE sink = ? AND seq = ?",
            (reason, now, sink, seq),
        )
        db.execute("DELETE FROM pending WHERE sink = ? AND seq = ?", (sink, seq))
    db.execute("COMMIT")


def listed(db: sqlite3.Connection, sink: str | None) -> list[DeadLetter]:
    """The dead letters of `sink` (None: of every sink), oldest first."""
    query = (
        "SELECT d.sink, d.seq, e.id, e.type, d.reason, d.attempts, d.at "
        "FROM dead_letters d JOIN events e ON e.seq = d.seq"
    )
    args: tuple[str, ...] = ()
    if sink is not None:
        query += " WHERE d.sink = ?"
        args = (sink,)
    rows = db.execute(query + " ORDER BY d.seq", args).fetchall()
    return [DeadLetter(*row) for row in rows]


def _matching(
    db: sqlite3.Connection, sink: str | None, seqs: Sequence[int] | None
) -> list[tuple[str, int]]:
    """(sink, seq) of the dead letters a replay or purge applies to (None: all)."""
    rows = db.execute("SELECT sink, seq FROM dead_letters").fetchall()
    return [(s, q) for s, q in rows if (sink is None or s == sink) and (seqs is None or q in seqs)]


def replay(db: sqlite3.Connection, sink: str | None, seqs: Sequence[int] | None) -> int:
    """Put dead letters back in their sink's queue; return how many."""
    db.execute("PRAGMA synchronous=FULL")
    db.execute("BEGIN IMMEDIATE")
    chosen = _matching(db, sink, seqs)
    for s, q in chosen:
        db.execute("INSERT OR IGNORE INTO pending (sink, seq) VALUES (?, ?)", (s, q))
        db.execute("DELETE FROM dead_letters WHERE sink = ? AND seq = ?", (s, q))
    db.execute("COMMIT")
    return len(chosen)


def purge(db: sqlite3.Connection, sink: str | None, seqs: Sequence[int] | None) -> int:
    """Delete dead letters for good; return how many."""
    db.execute("PRAGMA synchronous=FULL")
    db.execute("BEGIN IMMEDIATE")
    chosen = _matching(db, sink, seqs)
    db.executemany("DELETE FROM dead_letters WHERE sink = ? AND seq = ?", chosen)
    collect(db, [q for _, q in chosen])
    db.execute("COMMIT")
    return len(chosen)
