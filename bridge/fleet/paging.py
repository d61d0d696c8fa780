"""Keyset cursors for the fleet API's lists (instances, notices, upcoming, rejected).

A page is the rows after a position in the list's order, never an OFFSET: the store seeks
its index to the position and reads `limit` rows, so the 1,000th page costs what the first
does, and rows inserted meanwhile neither shift nor repeat what was already read (a row that
sorts before the position is simply not on the remaining pages; one after it is).

The cursor is the last row's sort key, JSON in URL-safe base64: opaque to clients (they pass
`next` back as `cursor`), and a tampered one is a clear 400, never an SQL error - its values
only ever reach the store as parameters.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

#: Rows of a list page when the request names no `limit` (announced in CHANGELOG); a
#: request may ask for up to `[fleet.api] page_size` (500).
DEFAULT_PAGE_SIZE: Final = 100
#: Longest cursor accepted, characters.
MAX_CURSOR: Final = 2048
_DECODE: Final = msgspec.json.Decoder(list[str | float | int | None])


class BadCursor(ValueError):
    """A cursor this service did not write (or for another list)."""


@dataclass(frozen=True, slots=True)
class Page:
    """Rows of one page and the cursor of the next (None on the last page)."""

    rows: list[dict[str, Any]]
    next: str | None


def encode(key: Sequence[Any]) -> str:
    return base64.urlsafe_b64encode(msgspec.json.encode(list(key))).decode().rstrip("=")


def decode(cursor: str, arity: int) -> list[Any]:
    """The sort key in `cursor`, which must hold `arity` values."""
    if len(cursor) > MAX_CURSOR:
        raise BadCursor("cursor: too long")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = _DECODE.decode(raw)
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise BadCursor("cursor: not a cursor of this list (pass `next` back as is)") from None
    if len(key) != arity:
        raise BadCursor("cursor: not a cursor of this list (pass `next` back as is)")
    return key


def page_of(rows: list[dict[str, Any]], limit: int, key: Any) -> Page:
    """The first `limit` of `rows` (the store read one more to know whether a next page
    exists) and the cursor after the last one, `key(row)` being its sort key."""
    if len(rows) <= limit:
        return Page(rows, None)
    shown = rows[:limit]
    return Page(shown, encode(key(shown[-1])))
