"""What the bridge remembers beside the events, in the spool so it commits with them: the
watchers' checkpoints, the actions (hook runs, approvals) and the notices in force.

An action is *planned* in the transaction that commits the notice it answers, so a crash
right after the commit does not forget it, and it is marked done in the transaction that
commits its audit event, so the two cannot disagree. The notices in force (what the status
API serves) are written in the notices' transaction, so a restart knows them.

`write` runs inside the caller's transaction; the readers are single statements.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from bridge.pipeline.spool_records import Action


def write(
    db: sqlite3.Connection,
    now: float,
    checkpoints: Mapping[str, Any],
    plan: Mapping[str, str],
    states: Mapping[str, str],
    in_force: Mapping[str, bytes | None],
) -> None:
    """Store checkpoints, add `plan`ned actions (unless the key exists), set actions'
    `states`, and set (bytes) or clear (None) notices in force."""
    for name, state in checkpoints.items():
        # msgspec's JSON: the spool's thread holds the GIL while it encodes, on every
        # notice's commit (an Azure checkpoint with three events: 11 us by `json`, 1.3 here).
        db.execute(
            "INSERT INTO watcher_state (name, state, updated) VALUES (?, ?, ?) "
            "ON CONFLICT(name) DO UPDATE SET state = excluded.state, "
            "updated = excluded.updated",
            (name, msgspec.json.encode(state).decode(), now),
        )
    if plan:  # most commits plan no action and set no state: no statement for them
        db.executemany(
            "INSERT OR IGNORE INTO actions (key, state, detail, updated) "
            "VALUES (?, 'planned', ?, ?)",
            [(key, detail, now) for key, detail in plan.items()],
        )
    if states:
        db.executemany(
            "INSERT INTO actions (key, state, detail, updated) VALUES (?, ?, '{}', ?) "
            "ON CONFLICT(key) DO UPDATE SET state = excluded.state, updated = excluded.updated",
            [(key, state, now) for key, state in states.items()],
        )
    for key, body in in_force.items():
        if body is None:
            db.execute("DELETE FROM in_force WHERE key = ?", (key,))
        else:
            db.execute("INSERT OR REPLACE INTO in_force (key, body) VALUES (?, ?)", (key, body))


def checkpoint(db: sqlite3.Connection, name: str) -> dict[str, Any] | None:
    """The last checkpoint the watcher `name` committed (None: it never did)."""
    row = db.execute("SELECT state FROM watcher_state WHERE name = ?", (name,)).fetchone()
    return json.loads(row[0]) if row else None


def actions(db: sqlite3.Connection, states: Sequence[str] | None) -> list[Action]:
    """Actions in one of `states` (None: all), oldest first."""
    rows = db.execute("SELECT key, state, detail FROM actions ORDER BY rowid").fetchall()
    return [Action(*row) for row in rows if states is None or row[1] in states]


def action_state(db: sqlite3.Connection, key: str) -> str | None:
    row = db.execute("SELECT state FROM actions WHERE key = ?", (key,)).fetchone()
    return str(row[0]) if row else None


def in_force(db: sqlite3.Connection) -> dict[str, bytes]:
    """The notices in force as last committed (key: the CloudEvent's bytes)."""
    rows = db.execute("SELECT key, body FROM in_force ORDER BY rowid").fetchall()
    return {key: bytes(body) for key, body in rows}
