"""The one parser of the times the bridge reads: metadata documents, checkpoints, API queries.

The clouds write times two ways: GCE, AWS's spot notices and our own checkpoints RFC 3339
(`2026-11-23T10:00:00Z`); Azure's `NotBefore` RFC 1123 (`Mon, 23 Nov 2026 10:00:00 GMT`) and
AWS's scheduled events the same without the weekday (`21 Jan 2019 09:00:43 GMT`).
A time without a zone (`2026-11-23T10:00:00`, or RFC 1123 without `GMT`) is taken as UTC:
the metadata services speak UTC, and a naive datetime must never reach a comparison with an
aware one (that raised, and crash-looped a watcher). Every result is an aware UTC datetime;
every failure is a `TimeParseError` (a `ValueError`), whatever the input's type.
"""

from __future__ import annotations

from datetime import UTC, datetime


class TimeParseError(ValueError):
    """The value is not a time in RFC 3339 or RFC 1123 form."""


def parse_time(value: object, *, naive_as_utc: bool = True) -> datetime:
    """`value` (RFC 3339 / ISO 8601 or RFC 1123) as an aware UTC datetime.

    `naive_as_utc=False` refuses a time without a zone instead: a person's query (the
    fleet API's `since`) may mean local time, and guessing UTC would silently shift it.
    """
    if not isinstance(value, str) or not value.strip():
        raise TimeParseError(f"expected a time string, got {_show(value)}")
    text = value.strip()
    try:
        parsed = _parse(text)
    except (ValueError, TypeError, IndexError, OverflowError) as exc:
        raise TimeParseError(f"{_show(value)} is not an RFC 3339 or RFC 1123 time") from exc
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        if not naive_as_utc:
            raise TimeParseError(f"{_show(value)} needs an offset (Z or +hh:mm)")
        parsed = parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise TimeParseError(f"{_show(value)} is out of range") from exc


def _parse(text: str) -> datetime:
    """RFC 3339 first (fromisoformat reads `Z` and fractions), then the mail-date forms:
    RFC 1123 with its weekday (Azure) and without it (AWS's `21 Jan 2019 09:00:43 GMT`)."""
    if text[:1] in "0123456789":
        try:
            return datetime.fromisoformat(text)
        except ValueError:
            pass  # a day-first mail date, e.g. AWS's scheduled events
    # Imported at the first mail date, not with this module: email.utils costs a GCE
    # bridge, which never reads one, 0.2 MiB of its idle footprint.
    from email.utils import parsedate_to_datetime

    return parsedate_to_datetime(text)


def parse_optional_time(value: object) -> datetime | None:
    """Like `parse_time`, but None and the empty string (Azure's "already started") are None."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return parse_time(value)


def lenient_time(value: object) -> tuple[datetime | None, str | None]:
    """For one field of a document: the time, or None with the reason it was refused.

    The caller logs the reason and carries on with the rest of the document: a bad time
    costs that field, never the notice.
    """
    try:
        return parse_optional_time(value), None
    except TimeParseError as exc:
        return None, str(exc)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
