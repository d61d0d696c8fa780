"""A bus message turned into its event's structured JSON, or the reason it cannot be one.

Apart from `bridge.fleet.sources.bus` (which uses it) so that the Event Hubs receiver
process (`bridge.fleet.sources.eventhubs_receiver`) converts messages without importing the
fleet's ingest path and its web server (half a second of start-up there).
"""

from __future__ import annotations

from collections.abc import Callable

from bridge import contract


def converted(convert: Callable[[], bytes]) -> bytes | str:
    """`convert()`, the structured JSON of a message's event, or why it cannot be one. A
    message is outside input: whatever its conversion raises is a reason to refuse it, never
    a crash of the source."""
    try:
        return convert()
    except contract.ContractError as exc:
        return str(exc)
    except Exception as exc:  # a binding library refusing a malformed message
        return f"not a CloudEvent: {type(exc).__name__}: {exc}"
