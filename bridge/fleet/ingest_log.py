"""One log line per refused ingest request, carrying what finds it again from the sidecar.

A sidecar whose post is refused logs the event id (`sink fleet rejected event <id> ...`) or
its retries; the fleet logs the refusal with the same id, so an operator holding one side's
line finds the other's. Each line has:

- `request_id`: the `webhook-id` header (the webhook sink sets it to the event id, or a
  stable id derived from the ids of a batch), else `X-Request-Id`, else `ce-id` (binary mode);
- `ingest`: the ingest source that answered (its `[[fleet.sources]] name`);
- `instance`: the CloudEvents `source` of the event(s): the `ce-source` header, or read from
  a body the source already read (never read here: a request refused on its headers keeps
  its body unread);
- `traceparent`: the events' CloudEvents distributed-tracing extension (W3C Trace Context),
  found the same way, when they carry one of the right shape (the fleet stores it with the
  event as received, so /v1/fleet/events shows it too);
- `status` and `reason`: the answer's status and its `error` text.

As `extra` fields, so `--log-format json` gives each its own key. A middleware rather than
lines in each source's handler: every way a post is refused (401, 413, 415, 400, 503) gets
the same line.

A bus source (Pub/Sub, Event Hubs, Kafka) has no request to answer: its sidecar's sink saw
the bus take the message, and the refusal happens later, in the fleet. `refused_messages`
gives each refused message the same fields (`request_id` is the event's `id`, which the
sidecar logs with its notice line; `status` is `rejected`), read from what the bus delivered
when it is JSON with those attributes, else `-`. At most `MESSAGES_LOGGED` lines per batch
and one line counting the rest: a bus replaying a flood of bad messages must not flood the
log too. Every refused message stays in the rejected table whatever is logged.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final

import msgspec
from aiohttp import web
from aiohttp.typedefs import Middleware

from bridge import contract
from bridge.fleet.store import Refused

log = logging.getLogger("bridge.fleet.ingest")

#: Instances named in one line, at most (a refused batch can hold thousands of events).
INSTANCES_SHOWN: Final = 3
#: Bytes of a read body parsed for the instances, at most; larger ones are not parsed.
PARSED_BODY: Final = 1024 * 1024
#: Refused bus messages logged one by one per committed batch, at most (then one summary).
MESSAGES_LOGGED: Final = 10

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: The request's key for the body once read (set by the http source): it streams in
#: (verified as it comes), so `request.read()` has nothing left to give the log. Here, not
#: in the source, so that the bus sources can log through this module without importing it.
BODY: Final = web.RequestKey("maintenance_bridge.body", bytes)


class _Attributes(msgspec.Struct):
    id: str = ""
    source: str = ""
    traceparent: str = ""


_ONE_OR_MANY: Final = msgspec.json.Decoder(_Attributes | list[_Attributes])
#: Only a `traceparent` of the contract's shape is logged, so a post cannot write what it
#: likes into the log.
_TRACEPARENT: Final = re.compile(contract.TRACEPARENT_PATTERN)


def request_id(request: web.Request) -> str:
    headers = request.headers
    return headers.get("webhook-id") or headers.get("x-request-id") or headers.get("ce-id") or "-"


def _named(values: list[str]) -> str:
    names = sorted(set(values))
    shown = ",".join(names[:INSTANCES_SHOWN])
    more = len(names) - INSTANCES_SHOWN
    return (shown + (f" and {more} more" if more > 0 else "")) or "-"


async def about(request: web.Request) -> tuple[str, str]:
    """(instances, traceparents) a request is about, as far as is known without reading: the
    events' `source` and the CloudEvents distributed-tracing `traceparent` they carry."""
    headers = request.headers
    if "ce-source" in headers:
        traceparent = headers.get("ce-traceparent", "")
        return headers["ce-source"], _named(
            [traceparent] if _TRACEPARENT.fullmatch(traceparent) else []
        )
    body = request.get(BODY)
    if not isinstance(body, bytes):
        return "-", "-"  # the source did not read the body: neither does the log
    events = _events(body)
    return (
        _named([e.source for e in events if e.source]),
        _named([e.traceparent for e in events if _TRACEPARENT.fullmatch(e.traceparent)]),
    )


def _events(body: bytes) -> list[_Attributes]:
    """The attributes of the event(s) `body` holds, as far as they can be read (none from
    a body too large to parse here, not JSON, not UTF-8 in a string - msgspec raises
    UnicodeDecodeError for that - or too deep for the decoder)."""
    if len(body) > PARSED_BODY:
        return []
    try:
        decoded = _ONE_OR_MANY.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError):
        return []
    return decoded if isinstance(decoded, list) else [decoded]


def refused_messages(ingest: str, refused: Sequence[Refused]) -> None:
    """One WARNING line per message a bus source refused (see the module docstring)."""
    for item in refused[:MESSAGES_LOGGED]:
        events = _events(item.body)
        fields = {
            "request_id": _named([e.id for e in events if e.id]),
            "ingest": ingest,
            "instance": _named([e.source for e in events if e.source]),
            "traceparent": _named(
                [e.traceparent for e in events if _TRACEPARENT.fullmatch(e.traceparent)]
            ),
            "status": "rejected",
            "reason": item.reason,
        }
        log.warning(
            "message refused: event %s, ingest %s, instance %s, trace %s: %s (kept in rejected)",
            fields["request_id"],
            ingest,
            fields["instance"],
            fields["traceparent"],
            item.reason,
            extra=fields,
        )
    if len(refused) > MESSAGES_LOGGED:
        log.warning(
            "ingest %s: %d more message(s) of this batch refused (kept in rejected)",
            ingest,
            len(refused) - MESSAGES_LOGGED,
        )


def _reason(response: web.StreamResponse) -> str:
    body = getattr(response, "body", None)
    if isinstance(body, bytes):
        try:
            error = json.loads(body).get("error")
        except (ValueError, AttributeError):
            error = None
        if isinstance(error, str):
            return error
    return response.reason or str(response.status)


def ingest_log(paths: Mapping[str, str]) -> Middleware:
    """The middleware for the ingest `paths` (path -> the ingest source's name)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        name = paths.get(request.path) if request.method == "POST" else None
        if name is None:
            return await handler(request)
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            await _log(request, name, exc)
            raise
        if response.status >= 400:
            await _log(request, name, response)
        return response

    return middleware


async def _log(request: web.Request, ingest: str, response: web.StreamResponse) -> None:
    instance, traceparent = await about(request)
    fields = {
        "request_id": request_id(request),
        "ingest": ingest,
        "instance": instance,
        "traceparent": traceparent,
        "status": response.status,
        "reason": _reason(response),
    }
    level = logging.ERROR if response.status >= 500 else logging.WARNING
    log.log(
        level,
        "POST %s refused (%d): request %s, ingest %s, instance %s, trace %s, from %s: %s",
        request.path,
        fields["status"],
        fields["request_id"],
        ingest,
        instance,
        traceparent,
        request.remote,
        fields["reason"],
        extra=fields,
    )
