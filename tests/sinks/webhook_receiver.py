"""Real local servers for the webhook sink tests: a scriptable receiver and a recording proxy.

`WebhookReceiver` is an aiohttp.web server on 127.0.0.1 (port 0, optionally TLS) that records
every request exactly as it arrived (method, path, headers, raw body, the client's TCP port)
and answers from a script, so tests exercise the sink's real HTTP client, keep-alive, TLS
and redirect handling instead of a mock transport. `RecordingProxy` is a tiny forward proxy
that only records the request line it was sent, to prove which requests went through it.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """Serve `app` on 127.0.0.1 (a free port) while the block runs; yields its /hook url."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server: Any = site._server
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    finally:
        await runner.cleanup()


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    peer_port: int


@dataclass(frozen=True)
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


class WebhookReceiver:
    """Records requests; answers POSTs from `script`, then `default`; OPTIONS per handshake."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.requests: list[Received] = []
        self.script: list[Reply] = []
        self.default = Reply(200)
        #: Set to grant the abuse-protection handshake (value of WebHook-Allowed-Origin).
        self.allowed_origin: str | None = None
        self.allowed_rate: str | None = None
        self.options_status = 200
        self._ssl = ssl_context
        self._runner: web.AppRunner | None = None
        self._changed = asyncio.Condition()
        self.port = 0

    @property
    def url(self) -> str:
        scheme = "https" if self._ssl else "http"
        return f"{scheme}://127.0.0.1:{self.port}/hook"

    async def start(self) -> WebhookReceiver:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._ssl)
        await site.start()
        server: Any = site._server
        self.port = server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def reply(self, *replies: Reply) -> None:
        """Answer the next POSTs with these, in order."""
        self.script.extend(replies)

    def posts(self) -> list[Received]:
        return [r for r in self.requests if r.method == "POST"]

    def options(self) -> list[Received]:
        return [r for r in self.requests if r.method == "OPTIONS"]

    async def wait_for_posts(self, count: int, timeout: float = 5.0) -> list[Received]:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: len(self.posts()) >= count)
        return self.posts()

    async def _handle(self, request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        received = Received(
            method=request.method,
            path=request.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=await request.read(),
            peer_port=int(peer[1]) if peer else 0,
        )
        async with self._changed:
            self.requests.append(received)
            self._changed.notify_all()
        if request.method == "OPTIONS":
            headers = {"allow": "POST, OPTIONS"}
            if self.allowed_origin is not None:
                headers["webhook-allowed-origin"] = self.allowed_origin
            if self.allowed_rate is not None:
                headers["webhook-allowed-rate"] = self.allowed_rate
            return web.Response(status=self.options_status, headers=headers)
        answer = self.script.pop(0) if self.script else self.default
        return web.Response(status=answer.status, headers=answer.headers)


class RecordingProxy:
    """A forward proxy that records each request line and its Proxy-Authorization.

    Absolute-form requests (http:// targets) are answered 200 by the proxy itself; CONNECT
    (https:// targets) opens a real tunnel to the requested host and pipes bytes both ways,
    so TLS to the origin runs end to end through it.
    """

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.request_lines: list[str] = []
        self.authorizations: list[str | None] = []
        self._ssl = ssl_context
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"{'https' if self._ssl else 'http'}://127.0.0.1:{self.port}"

    async def start(self) -> RecordingProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self._ssl)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await reader.readline()).decode("latin-1").strip()
            length = 0
            authorization = None
            while header := (await reader.readline()).strip():
                name, _, value = header.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
                if name.strip().lower() == "proxy-authorization":
                    authorization = value.strip()
            self.request_lines.append(line)
            self.authorizations.append(authorization)
            if line.startswith("CONNECT "):
                await self._tunnel(line.split()[1], reader, writer)
                return
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            await writer.drain()
        finally:
            writer.close()

    async def _tunnel(
        self, authority: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        host, _, port = authority.rpartition(":")
        up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()

        async def pipe(source: asyncio.StreamReader, target: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    target.write(data)
                    await target.drain()
            except ConnectionError:
                pass
            finally:
                target.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
