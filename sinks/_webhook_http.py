"""The webhook sink's HTTP/1.1 client: h11 for the protocol, asyncio streams for the socket.

Why not a general-purpose client: a sink drains its backlog one request at a time to one
origin, so the per-request cost of the client is the drain rate. Measured on loopback
against the same receiver, httpx (httpcore + anyio) spends about 0.6 ms of CPU per POST and
caps a drain near 1,200 events/s, while h11 driven directly over asyncio streams spends about
0.14 ms; aiohttp's client is as fast but adds 12 MiB of resident memory to every VM. The
protocol itself (framing, chunked and close-delimited bodies, keep-alive rules, header
validation) is h11's, a sans-IO implementation of RFC 9112; this module only owns the
connection, TLS, the proxy and the timeout.

What it does, and deliberately does not do:
- One origin per client (the sink's url), one connection, requests serialized by a lock.
- Keep-alive, with a connection idle for more than `KEEPALIVE_EXPIRY` seconds dropped before
  the next request: notices are hours apart and middleboxes silently forget idle flows, so a
  stale connection would otherwise cost a full timeout at the worst moment. A reused
  connection the server closed before answering is retried once on a fresh one.
- TLS always verified: certifi's public CAs, or the sink's `ca_bundle`.
- Redirects are never followed (the caller sees the 3xx); the process environment (proxy
  variables, `SSL_CERT_FILE`, `.netrc`) is never read.
- A proxy only when configured: absolute-form requests for http:// targets, a CONNECT tunnel
  for https:// ones; credentials in either url become Basic authorization.
- One timeout bounds the whole exchange: connect, TLS, tunnel, send and the full response.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import SplitResult, unquote, urlsplit

import h11

#: Seconds a connection may sit idle and still be reused (httpx's default, for the same reason).
KEEPALIVE_EXPIRY: Final = 5.0
#: Bytes of a response body kept; the rest is read and dropped (the sink only needs the status).
MAX_BODY: Final = 64 * 1024
_READ_SIZE: Final = 64 * 1024
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


class TransportError(Exception):
    """The exchange failed below HTTP: no connection, TLS refused, reset, malformed answer."""


class RequestTimeoutError(TransportError):
    """No complete response within the timeout."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    #: Lower-cased names; repeated headers joined with ", " (RFC 9110 list syntax).
    headers: Mapping[str, str]
    body: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a url points: scheme, host and port, plus Basic credentials if it carries any."""

    scheme: str
    host: str
    port: int
    authorization: str | None

    @classmethod
    def parse(cls, parts: SplitResult) -> Origin:
        if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
            raise ValueError("must be an http:// or https:// url with a host")
        credentials = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            credentials = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        port = parts.port or _DEFAULT_PORTS[parts.scheme]
        return cls(parts.scheme, parts.hostname, port, credentials)

    @property
    def authority(self) -> str:
        """`host[:port]` as the Host header and CONNECT want it (IPv6 in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == _DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"


class _Connection:
    """One TCP (maybe TLS) connection and the h11 state machine that frames it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = time.monotonic()

    def reusable(self) -> bool:
        fresh = time.monotonic() - self.idle_since < KEEPALIVE_EXPIRY
        return fresh and self.h11.our_state is h11.IDLE and not self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


class _StaleConnectionError(TransportError):
    """A reused connection closed before any byte of the answer: safe to send again."""


class Http1Client:
    """Requests to the one url a webhook sink posts to; see the module docstring."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float,
        ssl_context: ssl.SSLContext,
        proxy: str | None = None,
        user_agent: str,
    ) -> None:
        parts = urlsplit(url)
        self._origin = Origin.parse(parts)
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._proxy = Origin.parse(urlsplit(proxy)) if proxy else None
        if self._proxy is not None and self._origin.scheme == "http":
            # Absolute form, without the credentials the url may carry.
            self._target = f"http://{self._origin.authority}{self._target}"
        self._timeout = timeout
        self._ssl = ssl_context
        self._user_agent = user_agent
        self._connection: _Connection | None = None
        self._lock = asyncio.Lock()

    async def request(self, method: str, headers: Mapping[str, str], body: bytes = b"") -> Response:
        """Send one request and read the whole response, within the timeout."""
        async with self._lock:
            try:
                async with asyncio.timeout(self._timeout):
                    try:
                        return await self._exchange(method, headers, body)
                    except _StaleConnectionError:
                        return await self._exchange(method, headers, body)
            except TimeoutError:
                self._drop()
                raise RequestTimeoutError(
                    f"no complete response within {self._timeout:g} s"
                ) from None
            except TransportError:
                self._drop()
                raise
            except (OSError, EOFError, h11.ProtocolError) as exc:
                self._drop()
                raise TransportError(_describe(exc)) from exc
            except BaseException:
                # Cancelled mid-exchange: the connection is in an unknown state.
                self._drop()
                raise

    async def aclose(self) -> None:
        async with self._lock:
            connection, self._connection = self._connection, None
            if connection is not None:
                connection.close()
                with contextlib.suppress(OSError, ssl.SSLError):
                    await connection.writer.wait_closed()

    # -- one exchange ---------------------------------------------------------------------------

    async def _exchange(self, method: str, headers: Mapping[str, str], body: bytes) -> Response:
        connection = self._connection
        reused = connection is not None and connection.reusable()
        if connection is None or not reused:
            self._drop()
            connection = self._connection = await self._connect()
        assert connection is not None
        conn = connection.h11
        fields = [("host", self._origin.authority), ("user-agent", self._user_agent)]
        names = {name.lower() for name in headers}
        if self._origin.authorization is not None and "authorization" not in names:
            fields.append(("authorization", self._origin.authorization))
        if (
            self._proxy is not None
            and self._proxy.authorization is not None
            and self._origin.scheme == "http"
        ):
            fields.append(("proxy-authorization", self._proxy.authorization))
        fields += headers.items()
        fields.append(("content-length", str(len(body))))
        data = conn.send(h11.Request(method=method, target=self._target, headers=fields))
        if body:
            data = (data or b"") + (conn.send(h11.Data(data=body)) or b"")
        data = (data or b"") + (conn.send(h11.EndOfMessage()) or b"")
        try:
            connection.writer.write(data)
            await connection.writer.drain()
            response = await self._read_response(connection)
        except (ConnectionError, EOFError, h11.RemoteProtocolError) as exc:
            if reused and conn.their_state is h11.SEND_RESPONSE:
                self._drop()
                raise _StaleConnectionError(_describe(exc)) from exc
            raise
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
            connection.idle_since = time.monotonic()
        else:
            self._drop()
        return response

    async def _read_response(self, connection: _Connection) -> Response:
        conn = connection.h11
        head: h11.Response | None = None
        chunks: list[bytes] = []
        kept = 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await connection.reader.read(_READ_SIZE)
                if not data and conn.their_state is h11.SEND_RESPONSE:
                    raise EOFError("the server closed the connection without answering")
                conn.receive_data(data)
            elif isinstance(event, h11.Response):
                head = event
            elif isinstance(event, h11.Data):
                if kept < MAX_BODY:
                    chunks.append(bytes(event.data[: MAX_BODY - kept]))
                    kept += len(chunks[-1])
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise EOFError("the server closed the connection mid-response")
            # h11.InformationalResponse (1xx) is skipped: the final answer follows.
        assert head is not None
        headers: dict[str, str] = {}
        for raw_name, raw_value in head.headers:
            name, value = raw_name.decode("ascii"), raw_value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        return Response(head.status_code, headers, b"".join(chunks))

    # -- connecting -----------------------------------------------------------------------------

    async def _connect(self) -> _Connection:
        hop = self._proxy or self._origin
        try:
            reader, writer = await asyncio.open_connection(
                hop.host,
                hop.port,
                ssl=self._ssl if hop.scheme == "https" else None,
                server_hostname=hop.host if hop.scheme == "https" else None,
            )
        except ssl.SSLError as exc:
            raise TransportError(f"TLS with {hop.authority} failed: {_describe(exc)}") from exc
        except OSError as exc:
            what = "proxy " if hop is self._proxy else ""
            message = f"cannot connect to {what}{hop.authority}: {_describe(exc)}"
            raise TransportError(message) from exc
        connection = _Connection(reader, writer)
        if self._proxy is not None and self._origin.scheme == "https":
            try:
                await self._tunnel(connection)
                await writer.start_tls(self._ssl, server_hostname=self._origin.host)
            except BaseException:
                connection.close()
                raise
            connection = _Connection(reader, writer)
        return connection

    async def _tunnel(self, connection: _Connection) -> None:
        """Ask the proxy for a tunnel to the origin (CONNECT); TLS then runs inside it."""
        assert self._proxy is not None
        authority = f"{self._origin.host}:{self._origin.port}"
        if ":" in self._origin.host:
            authority = f"[{self._origin.host}]:{self._origin.port}"
        fields = [("host", authority), ("user-agent", self._user_agent)]
        if self._proxy.authorization is not None:
            fields.append(("proxy-authorization", self._proxy.authorization))
        conn = connection.h11
        connection.writer.write(
            (conn.send(h11.Request(method="CONNECT", target=authority, headers=fields)) or b"")
            + (conn.send(h11.EndOfMessage()) or b"")
        )
        await connection.writer.drain()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await connection.reader.read(_READ_SIZE)
                if not data:
                    raise TransportError(f"proxy {self._proxy.authority} closed the tunnel")
                conn.receive_data(data)
            elif isinstance(event, h11.Response):
                if not 200 <= event.status_code < 300:
                    raise TransportError(
                        f"proxy {self._proxy.authority} refused the tunnel to {authority}: "
                        f"HTTP {event.status_code}"
                    )
                return

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
