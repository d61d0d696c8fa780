"""Receive maintenance-bridge webhooks: verify the Standard Webhooks signature, parse events.

Copy this file, then:

    pip install aiohttp cloudevents standardwebhooks
    WEBHOOK_SECRET=whsec_... python webhook_receiver.py   # listens on :8080/hook

It accepts all three content modes of the sink (structured, binary, batch), answers the
optional abuse-protection handshake, and refuses (401) anything whose signature does not
verify. The bridge delivers at least once: the same event can arrive twice (after a timeout
or a restart), always with the same `webhook-id` (the CloudEvent id), so de-duplicate on it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable

from aiohttp import web
from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings.http import HTTPMessage, from_http
from cloudevents.core.formats.json import JSONFormat
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

BATCH_CONTENT_TYPE = "application/cloudevents-batch+json"
Handler = Callable[[BaseCloudEvent], Awaitable[None]]


def parse_events(headers: dict[str, str], body: bytes) -> list[BaseCloudEvent]:
    """The CloudEvents in one request, whichever content mode the sink uses."""
    event_format = JSONFormat()
    if headers.get("content-type", "").startswith(BATCH_CONTENT_TYPE):
        return [event_format.read(None, json.dumps(item)) for item in json.loads(body)]
    return [from_http(HTTPMessage(headers=headers, body=body), event_format)]


async def print_event(event: BaseCloudEvent) -> None:
    data = event.get_data()
    instance = data["instance"]["name"] if isinstance(data, dict) else "?"
    print(f"{event.get_type()} for {instance} (id {event.get_id()})")


def make_app(
    secret: str, handle: Handler = print_event, allowed_origins: frozenset[str] = frozenset()
) -> web.Application:
    webhook = Webhook(secret)  # accepts the "whsec_..." form as configured on the sink
    seen: dict[str, None] = {}  # recent webhook-ids; use a shared store with several replicas

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()  # the exact bytes that were signed: verify before parsing
        headers = {name.lower(): value for name, value in request.headers.items()}
        try:
            webhook.verify(body, headers)
        except WebhookVerificationError:
            return web.Response(status=401, text="bad signature")
        if headers["webhook-id"] in seen:
            return web.Response(status=204)  # a redelivery: already handled
        events = parse_events(headers, body)
        if len(events) == 1 and events[0].get_id() != headers["webhook-id"]:
            # The v1 signature covers the body, not the ce- headers (v1ce does, docs/webhook.md):
            # at least tie the event to the signed id.
            return web.Response(status=400, text="event id does not match webhook-id")
        for event in events:
            await handle(event)
        seen[headers["webhook-id"]] = None
        if len(seen) > 10_000:
            del seen[next(iter(seen))]
        return web.Response(status=204)

    async def handshake(request: web.Request) -> web.Response:
        """CloudEvents abuse protection: consent only to the senders we know."""
        origin = request.headers.get("WebHook-Request-Origin", "")
        if origin not in allowed_origins:
            return web.Response(status=403)
        return web.Response(
            headers={
                "WebHook-Allowed-Origin": origin,
                "WebHook-Allowed-Rate": "120",
                "Allow": "POST, OPTIONS",
            }
        )

    app = web.Application()
    app.router.add_post("/hook", receive)
    app.router.add_route("OPTIONS", "/hook", handshake)
    return app


if __name__ == "__main__":
    origins = frozenset(filter(None, os.environ.get("WEBHOOK_ALLOWED_ORIGINS", "").split(",")))
    web.run_app(make_app(os.environ["WEBHOOK_SECRET"], allowed_origins=origins), port=8080)
