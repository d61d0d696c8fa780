"""What the fleet keeps is bounded: one check, on every ingest path, before the store.

The contract (`bridge.contract`) says what an event of schema v1 is; it does not say what a
database can hold or what the fleet's reads can show again. An event the schema admits
can still break the store for everyone behind it: a time that is year 10000 once taken to
UTC (every read then fails to format it), an integer past 2^63 (PostgreSQL's BIGINT and
SQLite's INTEGER refuse it, so the batch fails for ever), JSON nested thousands deep (the
decoder's recursion limit), a body that is not UTF-8 (the audit log keeps text). So every
source's bodies pass `event` (through `bridge.fleet.sources.base.classify`) and a batch is
split by `split_batch`: what is out of bounds is refused with its reason, like any other
invalid event, and recorded in the rejected table; the rest of the batch is committed.

The limits (docs/fleet.md "Limits" lists them for users):

- JSON nesting: `MAX_DEPTH` levels (simdjson allows 1,024, protobuf 100; an event needs 5).
- Strings: `MAX_STRING` characters each (a hook's output tail is 4 KiB).
- Integers: signed 64 bits, what both stores' integer columns hold.
- Times (the event's `time` and every time in its data): years 1-9999 once in UTC.
- A heartbeat's `interval_seconds`: at most `MAX_HEARTBEAT_INTERVAL` (a larger one would
  keep a dead VM `reporting` for that long).
- Times ahead of the fleet's clock: liveness never uses a heartbeat's time past its receive
  time (`liveness_time`), so a VM whose clock is a day ahead is not `reporting` a day after
  it stopped.
"""

from __future__ import annotations

import functools
import re
import typing
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from bridge import contract

MAX_DEPTH: Final = 64
MAX_STRING: Final = 65536
INT_MIN: Final = -(2**63)
INT_MAX: Final = 2**63 - 1
MAX_HEARTBEAT_INTERVAL: Final = 86400.0

_ANY: Final = msgspec.json.Decoder()
#: An integer of 19 digits or more (2^63 has 19) follows a `:`, `[` or `,` (whitespace and
#: a minus between) or starts the document: `_may_be_out_of_bounds` looks for it in the
#: body with each digit as 0x00 and each of those as 0x01, whitespace and minus deleted
#: (bytes that valid JSON only holds escaped), which `bytes.translate` does in C.
_DIGITS_AND_SEPARATORS: Final = bytes.maketrans(b"0123456789:[,", b"\0" * 10 + b"\1" * 3)
_BETWEEN: Final = b" \t\n\r-"
_LONG_INTEGER: Final = b"\1" + b"\0" * 19
#: The years whose times may leave years 1-9999 once in UTC (an offset is less than a day).
_EDGE_YEARS: Final = frozenset((1, 9999))
#: The tokens that matter to find a batch's elements: strings (skipped whole), brackets, commas.
_TOKEN: Final = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{},]', re.DOTALL)


class OutOfBounds(contract.ContractError):
    """Valid against the schema, but more than the fleet keeps; the message says what."""


def event(body: bytes) -> contract.Event:
    """`body` as a typed event, checked against the contract and the fleet's bounds;
    raises `ContractError` (or `OutOfBounds`) naming the reason."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OutOfBounds(f"not UTF-8: byte {exc.start} is {body[exc.start]:#04x}") from None
    if _may_be_out_of_bounds(body):
        try:
            check_tree(_ANY.decode(text))
        except RecursionError:
            raise OutOfBounds(f"JSON nested deeper than {MAX_DEPTH} levels") from None
        except msgspec.DecodeError:
            pass  # not JSON: the contract says so in its own words
    value = contract.from_cloudevent(body)
    if _in_edge_year(value):
        check_times(value)
    data = value.data
    if isinstance(data, contract.HeartbeatData) and data.interval_seconds > MAX_HEARTBEAT_INTERVAL:
        raise OutOfBounds(
            f"data.interval_seconds: {data.interval_seconds:g} is more than "
            f"{MAX_HEARTBEAT_INTERVAL:g} (a day)"
        )
    return value


def _may_be_out_of_bounds(body: bytes) -> bool:
    """Whether `check_tree` could refuse `body`, from its bytes alone (a few scans in C,
    where the walk is a pass over every value in Python, the most of what checking an
    event costs): a string longer than `MAX_STRING` characters needs a body at least that
    long, nesting deeper than `MAX_DEPTH` as many brackets, an integer past 64 bits a
    token of 19 digits. Over-cautious (brackets and digits inside strings count too), so
    the walk runs on anything that could fail it and the answer is always the walk's."""
    if len(body) > MAX_STRING or body.count(b"{") + body.count(b"[") > MAX_DEPTH:
        return True
    tokens = b"\1" + body.translate(_DIGITS_AND_SEPARATORS, _BETWEEN)
    return _LONG_INTEGER in tokens


def check_tree(tree: Any) -> None:
    """Raise `OutOfBounds` for JSON deeper than `MAX_DEPTH`, a string longer than
    `MAX_STRING` or an integer outside 64 bits, naming where (a JSON path)."""
    stack: list[tuple[Any, str, int]] = [(tree, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                where = path if len(path) <= 40 else path[:40] + "..."
                raise OutOfBounds(f"{where}: JSON nested deeper than {MAX_DEPTH} levels")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str) and len(key) > MAX_STRING:
                    raise OutOfBounds(f"{path}: a key longer than {MAX_STRING} characters")
                step = (
                    (f"{path}.{key}" if path else key) if isinstance(key, str) else f"{path}[{key}]"
                )
                stack.append((item, step, depth + 1))
        elif isinstance(value, str) and len(value) > MAX_STRING:
            raise OutOfBounds(f"{path}: longer than {MAX_STRING} characters")
        elif isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
            raise OutOfBounds(f"{path}: {value} is outside signed 64 bits")


def _in_edge_year(item: msgspec.Struct) -> bool:
    """Whether a time of `item` (an event, or a Struct of it) is in year 1 or 9999: only
    such a time can leave years 1-9999 once in UTC, so `event` walks an event with
    `check_times` only then. The time fields of each Struct type are looked up once
    (`_timed_fields`): a heartbeat's check reads two times, not every value."""
    for name in _timed_fields(type(item)):
        value = getattr(item, name)
        if isinstance(value, datetime):
            if value.year in _EDGE_YEARS:
                return True
        elif isinstance(value, msgspec.Struct):
            if _in_edge_year(value):
                return True
        elif value is not None:  # a collection that may hold times: let the walk look
            return True
    return False


@functools.cache
def _timed_fields(cls: type[msgspec.Struct]) -> tuple[str, ...]:
    """The fields of `cls` whose type may hold a time, at any depth (a union, a Struct, a
    collection of them); `Any` decodes to JSON values, never to a time."""
    return tuple(
        field.name
        for field in msgspec.structs.fields(cls)
        if _may_hold_time(field.type, frozenset())
    )


def _may_hold_time(hint: Any, seen: frozenset[type]) -> bool:
    if isinstance(hint, type):
        if issubclass(hint, datetime):
            return True
        if issubclass(hint, msgspec.Struct):
            if hint in seen:
                return False  # a recursive Struct: its fields are being looked at already
            inside = seen | {hint}
            return any(_may_hold_time(f.type, inside) for f in msgspec.structs.fields(hint))
    # a union, a collection, `Annotated`: what it is made of (a `Literal`'s values are none)
    return any(_may_hold_time(arg, seen) for arg in typing.get_args(hint))


def check_times(value: contract.Event) -> None:
    """Raise `OutOfBounds` unless every time of the event is within years 1-9999 in UTC.

    Only a time in year 1 or 9999 can leave that range once in UTC (an offset is less than
    a day), so `event` walks the event only when it holds such a time (`_in_edge_year`)."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, datetime):
            try:
                item.astimezone(UTC)
            except OverflowError:
                raise OutOfBounds(
                    f"{path}: {item.isoformat()} is outside years 1-9999 in UTC"
                ) from None
        elif isinstance(item, msgspec.Struct):
            for name in item.__struct_fields__:
                stack.append((getattr(item, name), f"{path}.{name}" if path else name))
        elif isinstance(item, list):
            stack.extend((element, f"{path}[{i}]") for i, element in enumerate(item))


def liveness_time(event_time: float, received_at: float) -> float:
    """The time a heartbeat or event vouches for the VM: its own time, never later than when
    the fleet received it (a VM clock running ahead cannot make it look alive)."""
    return min(event_time, received_at)


def split_batch(body: bytes) -> list[bytes]:
    """The elements of a JSON array (a CloudEvents batch), each as its exact bytes.

    `contract.split_batch` first (fast); when the array is nested past the decoder's
    recursion limit, a tokenizer finds the elements instead, so one element too deep is
    refused alone (by `event`) and the rest of the batch still counts. `ContractError` when
    the body is no JSON array at all."""
    try:
        return contract.split_batch(body)
    except RecursionError:
        pass
    except UnicodeDecodeError as exc:
        raise OutOfBounds(f"not UTF-8: byte {exc.start}") from None
    stripped = body.strip()
    if not stripped.startswith(b"[") or not stripped.endswith(b"]"):
        raise contract.ContractError("not a JSON array of CloudEvents")
    offset = len(body) - len(body.lstrip())
    elements: list[bytes] = []
    depth, start = 0, offset + 1
    for token in _TOKEN.finditer(body, offset):
        kind = token.group()
        if kind in (b"[", b"{"):
            depth += 1
        elif kind in (b"]", b"}"):
            depth -= 1
            if depth == 0:
                elements.append(body[start : token.start()].strip())
                break
        elif kind == b"," and depth == 1:
            elements.append(body[start : token.start()].strip())
            start = token.end()
    return [element for element in elements if element]
