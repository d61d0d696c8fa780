"""The `?` placeholders of a statement over a list of values, and the slices of that list
one statement takes: the sidecar's spool and both fleet stores write and read sets of rows
with `IN (?, ...)` (one statement per slice rather than one per row: each statement SQLite
steps is a trip through the interpreter), so there is one way to spell them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


def marks(count: int) -> str:
    """The placeholders of `count` values: "?, ?, ?"."""
    return ", ".join("?" * count)


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """`items` in slices of at most `size`, in order, for one statement each."""
    for start in range(0, len(items), size):
        yield items[start : start + size]
