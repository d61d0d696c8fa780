"""`python -m bench.fleet_floor PORT`: the HTTP floor of the one-event posts figure.

A do-nothing aiohttp server: `POST /v1/events` reads the body and answers what the fleet
service answers for one new event, with no signature check, no parse and no store. The
benchmark posts the same signed one-event requests from the same client to it and to the
fleet service in the same run; the fleet's rate over this one's is the issue's ratio.
"""

from __future__ import annotations

import sys

from aiohttp import web

ANSWER = b'{"accepted": 1, "duplicate": 0, "invalid": 0}'


async def events(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=ANSWER, content_type="application/json")


def main(argv: list[str] | None = None) -> int:
    port = int((argv if argv is not None else sys.argv[1:])[0])
    app = web.Application()
    app.router.add_post("/v1/events", events)
    app.router.add_get("/readyz", lambda _request: web.Response(text="ok"))  # type: ignore[arg-type,return-value]
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
