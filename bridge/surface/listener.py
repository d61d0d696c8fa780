"""The bridge's one HTTP listener: a small GET-only server on asyncio streams.

Why not aiohttp's server: importing `aiohttp.web` costs about as much as the whole rest of
the start-up, and what is served here is a handful of small GET answers to a scraper, a
kubelet probe, a load balancer or a local script. A request is read with a size limit and a
timeout (a stuck client cannot hold the loop), answered with `Connection: close`, and a
handler that raises becomes a 500 with the error logged, never a dead listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qsl, urlsplit

log = logging.getLogger("bridge.listener")

MAX_HEAD = 16 * 1024


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, status: int, value: object) -> Response:
        body = json.dumps(value, indent=2, sort_keys=False).encode() + b"\n"
        return cls(status, body, "application/json")

    @classmethod
    def text(cls, status: int, text: str) -> Response:
        return cls(status, text.encode())


Handler = Callable[[Request], Awaitable[Response]]


class ListenerError(Exception):
    """The listener could not bind its address."""


class Listener:
    """Serves `routes` (exact paths) on `host:port` until `stop`."""

    def __init__(
        self, host: str, port: int, routes: Mapping[str, Handler], *, read_timeout: float = 5.0
    ) -> None:
        self._host = host
        self._port = port
        self._routes = dict(routes)
        self._read_timeout = read_timeout
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The bound host and port (the real one when the configured port was 0)."""
        if self._server is None or not self._server.sockets:
            return self._host, self._port
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(
                self._serve, self._host, self._port, limit=MAX_HEAD
            )
        except OSError as exc:
            raise ListenerError(
                f"cannot listen on {self._host}:{self._port}: {exc.strerror or exc} "
                "(set listener.port, or listener.enabled = false)"
            ) from exc
        log.info("listening on %s (%s)", self.url, ", ".join(sorted(self._routes)))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            response, head_only = await self._answer(reader)
            await self._write(writer, response, head_only)
        except (ConnectionError, TimeoutError):
            pass  # the client went away; nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[Response, bool]:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self._read_timeout)
        except asyncio.LimitOverrunError:
            return Response.text(431, "request head too large\n"), False
        except asyncio.IncompleteReadError:
            raise ConnectionError("client closed before the end of the request") from None
        except TimeoutError:
            return Response.text(408, "request not received in time\n"), False
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return Response.text(400, "not an HTTP/1.x request line\n"), False
        method, target, _version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers:
            return Response.text(400, "this listener takes no request body\n"), False
        if method not in ("GET", "HEAD"):
            return Response(405, b"only GET and HEAD\n", headers={"Allow": "GET, HEAD"}), False
        split = urlsplit(target)
        handler = self._routes.get(split.path)
        if handler is None:
            known = ", ".join(sorted(self._routes))
            return Response.text(404, f"no such path; this listener serves {known}\n"), False
        request = Request(method, split.path, dict(parse_qsl(split.query)), headers)
        try:
            return await handler(request), method == "HEAD"
        except Exception:
            log.exception("listener: %s %s failed", method, split.path)
            return Response.text(500, "internal error; see the bridge's log\n"), False

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, response: Response, head_only: bool) -> None:
        reason = HTTPStatus(response.status).phrase
        header_lines = [
            f"HTTP/1.1 {response.status} {reason}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
            "Cache-Control: no-store",
            "Connection: close",
            *(f"{name}: {value}" for name, value in response.headers.items()),
        ]
        writer.write(("\r\n".join(header_lines) + "\r\n\r\n").encode("latin-1"))
        if not head_only:
            writer.write(response.body)
        await writer.drain()
