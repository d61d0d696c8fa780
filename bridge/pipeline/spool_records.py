"""What goes into the spool and what comes out of it, and the one error it raises.

Kept apart from `spool.py` so that the modules holding the spool's SQL (`spool_schema`,
`spool_outbox`, `spool_dead_letters`, `spool_state`) and the `Spool` that runs it share
these names without importing each other in a circle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: Events per statement of a set-based write (`IN (?, ...)`): far below the 999 variables
#: SQLite allowed before 3.32, so any SQLite a Python 3.11 links takes it.
CHUNK: Final = 500


class SpoolError(Exception):
    """The spool cannot store or read (disk full, permissions, corruption)."""


@dataclass(frozen=True, slots=True)
class Spooled:
    seq: int
    id: str
    body: bytes
    attempts: int


@dataclass(frozen=True, slots=True)
class NewEvent:
    id: str
    source: str
    type: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Action:
    """One row of the actions table: `detail` is the JSON the planner stored with it."""

    key: str
    state: str
    detail: str


@dataclass(frozen=True, slots=True)
class DeadLetter:
    sink: str
    seq: int
    id: str
    type: str
    reason: str
    attempts: int
    at: float
