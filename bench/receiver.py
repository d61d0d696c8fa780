"""The webhook receiver of the benchmarks: its own process, stamps each event on arrival.

    python -m bench.receiver PORT

POST /hook/<name>: a structured CloudEvent or a batch; each event is recorded with
`time.monotonic()` taken when the whole body has been read (the moment the receiver holds
the event), its id, type, `data.notice_id` and `data.raw`. GET /records/<name> returns them;
GET /wait/<name>?count=N answers once N events arrived (or after `timeout` seconds), so the
driver waits without polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections import defaultdict
from typing import Any

from aiohttp import web

Record = dict[str, Any]


def records_of(name: str, body: bytes, stamp: float) -> list[Record]:
    """What a POST to /hook/<name> adds to the records, all stamped `stamp`."""
    if name.startswith("drain"):
        # Throughput runs: count the events held, no parsing, so the receiver's own
        # cost stays small next to the sender's.
        return [{"at": stamp} for _ in range(body.count(b'"specversion"'))]
    parsed = json.loads(body)
    events = parsed if isinstance(parsed, list) else [parsed]
    return [
        {
            "at": stamp,
            "id": event.get("id"),
            "type": event.get("type"),
            "notice_id": (event.get("data") or {}).get("notice_id"),
            "status": (event.get("data") or {}).get("status"),
            "raw": (event.get("data") or {}).get("raw"),
        }
        for event in events
    ]


def build_app() -> web.Application:
    records: dict[str, list[Record]] = defaultdict(list)
    arrived = asyncio.Condition()

    async def hook(request: web.Request) -> web.Response:
        body = await request.read()
        stamp = time.monotonic()
        name = request.match_info["name"]
        records[name].extend(records_of(name, body, stamp))
        async with arrived:
            arrived.notify_all()
        return web.Response(status=204)

    async def get_records(request: web.Request) -> web.Response:
        return web.json_response(records[request.match_info["name"]])

    async def wait(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        count = int(request.query.get("count", "1"))
        timeout = float(request.query.get("timeout", "10"))
        async with arrived:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    arrived.wait_for(lambda: len(records[name]) >= count), timeout
                )
        return web.json_response({"count": len(records[name])})

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post("/hook/{name}", hook)
    app.router.add_get("/records/{name}", get_records)
    app.router.add_get("/wait/{name}", wait)
    return app


def main() -> None:
    web.run_app(build_app(), host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)


if __name__ == "__main__":
    main()


class Receiver:
    """The driver's handle on a running receiver process."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._session: Any = None

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/hook/{name}"

    async def _get(self, path: str) -> Any:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{self.port}{path}") as response:
            response.raise_for_status()
            return await response.json()

    async def ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                await self._get("/records/ready")
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    async def wait(self, name: str, count: int, timeout: float = 10.0) -> int:
        answer = await self._get(f"/wait/{name}?count={count}&timeout={timeout}")
        got: int = answer["count"]
        return got

    async def records(self, name: str) -> list[Record]:
        result: list[Record] = await self._get(f"/records/{name}")
        return result

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
