"""The one HTTP/1.1 client of the bridge: h11 for the protocol, asyncio streams for the socket.

Both of the bridge's HTTP conversations are with one origin each, at a steady pace: the
metadata watchers poll (Azure once a second, for the life of the VM) and the webhook sink
drains its backlog one request at a time. So the client's per-request cost is the idle CPU
of every VM and the drain rate of every backlog, and its import is part of every start-up.
Measured on loopback: httpx (httpcore + anyio) spends about 0.6 ms of CPU per request,
capped a webhook drain near 1,200 events/s and cost 47 ms and 5 MiB to import; h11 driven
directly over asyncio streams spends about 0.14 ms and 7 ms; aiohttp's client is as fast but
adds 12 MiB of resident memory. The protocol itself (framing, chunked and close-delimited
bodies, keep-alive rules, header validation) is h11's, a sans-IO implementation of RFC 9112;
this module only owns the connections, TLS, the proxy and the timeouts.

What it does, and deliberately does not do:
- One origin per client (a base url); requests concurrent on a small pool of connections
  (the GCE watcher keeps two long polls hanging while it asks for other keys).
- Keep-alive, with a connection idle for more than `KEEPALIVE_EXPIRY` seconds dropped before
  the next request: notices are hours apart and middleboxes silently forget idle flows, so a
  stale connection would otherwise cost a full timeout at the worst moment. A reused
  connection the server closed before answering is retried once on a fresh one.
- TLS always verified: certifi's public CAs, or the sink's `ca_bundle`; a client certificate
  when the sink has one. A context given as a callable is asked for at each new connection,
  so renewed certificate files apply from the next connection on.
- Redirects are never followed (the caller sees the 3xx); the process environment (proxy
  variables, `SSL_CERT_FILE`, `.netrc`) is never read, so metadata traffic can never be sent
  to a proxy.
- A proxy only when configured: absolute-form requests for http:// targets, a CONNECT tunnel
  for https:// ones; credentials in either url become Basic authorization.
- One timeout bounds the whole exchange: connect, TLS, tunnel, send and the full response.
- Bodies beyond `max_body` bytes are read and dropped, and the response says `truncated`.
- Acknowledgements at once while an answer is awaited (`TCP_QUICKACK`, Linux), because many
  servers (Python's `http.server`, werkzeug, ...) write an answer's head and body in two
  `send` calls with Nagle's algorithm on: the body then waits in the server until the head is
  acknowledged, and on a kept-alive connection Linux delays that acknowledgement (40 ms at
  least) once the flow looks interactive, request after answer. A fresh connection starts
  in quick-ack mode, which is why a connection per request never showed it. Quick-ack mode
  is not sticky (sending the next request ends it), so it is asked for again before every
  read. Where the option does not exist (Windows, macOS) nothing is set and such servers
  stay slow on a kept connection; the requests still work.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import SplitResult, unquote, urlencode, urlsplit

import h11

#: Seconds a connection may sit idle and still be reused (httpx's default, for the same reason).
KEEPALIVE_EXPIRY: Final = 5.0
#: Bytes of a response body kept by default; the rest is read and dropped.
MAX_BODY: Final = 1024 * 1024
_READ_SIZE: Final = 64 * 1024
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
#: Linux's per-socket switch to acknowledge received data at once (None where it is absent;
#: typeshed declares the constant for Linux only, so it is looked up, not referenced).
QUICK_ACK: Final[int | None] = getattr(socket, "TCP_QUICKACK", None)


class TransportError(Exception):
    """The exchange failed below HTTP: no connection, TLS refused, reset, malformed answer."""


class RequestTimeoutError(TransportError):
    """No complete response within the timeout."""


class NameResolutionError(TransportError):
    """The host name did not resolve (DNS): a different fix from an unreachable address."""

    def __init__(self, message: str, host: str) -> None:
        super().__init__(message)
        self.host = host


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    #: Lower-cased names; repeated headers joined with ", " (RFC 9110 list syntax).
    headers: Mapping[str, str]
    body: bytes = field(repr=False)
    #: The body was longer than the client's `max_body`; `body` holds its beginning.
    truncated: bool = False

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body as JSON; `ValueError` (json.JSONDecodeError) when it is not."""
        return json.loads(self.body)


@functools.cache
def public_cas() -> ssl.SSLContext:
    """certifi's public CAs, loaded once per process (a context costs ~1 ms and ~1 MiB).

    certifi is imported here, at the first https:// connection, not with this module: its
    import pulls in `importlib.resources` (tempfile, shutil, compression modules), about
    20 ms and 1 MiB on its own, which plain-http metadata and webhooks never need.
    """
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


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
    def address(self) -> str:
        """`host:port`, the port always written, as CONNECT wants it (IPv6 in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def authority(self) -> str:
        """`host[:port]` as the Host header wants it: the scheme's default port left out."""
        if self.port != _DEFAULT_PORTS[self.scheme]:
            return self.address
        return f"[{self.host}]" if ":" in self.host else self.host


class _Connection:
    """One TCP (maybe TLS) connection and the h11 state machine that frames it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = time.monotonic()
        # The TCP socket under the stream (under TLS too); None where quick acks are absent.
        self._quickack_socket: Any = (
            writer.get_extra_info("socket") if QUICK_ACK is not None else None
        )

    def ack_at_once(self) -> None:
        """Have the kernel acknowledge what arrives next without delay (see the module
        docstring: a server's Nagle wait on its own unacknowledged head). Cheap (one
        `setsockopt`); a socket that refuses it is left alone from then on."""
        if self._quickack_socket is None:
            return
        try:
            self._quickack_socket.setsockopt(socket.IPPROTO_TCP, QUICK_ACK, 1)
        except OSError:
            self._quickack_socket = None

    async def read(self) -> bytes:
        """The next bytes of the answer, acknowledged at once as they arrive."""
        self.ack_at_once()
        return await self.reader.read(_READ_SIZE)

    def reusable(self) -> bool:
        fresh = time.monotonic() - self.idle_since < KEEPALIVE_EXPIRY
        return fresh and self.h11.our_state is h11.IDLE and not self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


class _StaleConnectionError(TransportError):
    """A reused connection closed before any byte of the answer: safe to send again."""


class Http1Client:
    """Requests to one origin, relative to a base url; see the module docstring."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float,
        user_agent: str,
        headers: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | Callable[[], ssl.SSLContext] | None = None,
        proxy: str | None = None,
        max_body: int = MAX_BODY,
    ) -> None:
        parts = urlsplit(base_url)
        self._origin = Origin.parse(parts)
        self._path = parts.path or "/"
        self._query = parts.query
        self._proxy = Origin.parse(urlsplit(proxy)) if proxy else None
        self._timeout = timeout
        self._ssl = ssl_context
        self._user_agent = user_agent
        self._headers = dict(headers or {})
        self._max_body = max_body
        self._idle: list[_Connection] = []
        self._busy: set[_Connection] = set()

    def target(self, path: str = "", params: Mapping[str, str] | None = None) -> str:
        """The request target of `path` (relative to the base url) with `params` added."""
        target = self._path + path.lstrip("/") if path else self._path
        query = "&".join(q for q in (self._query, urlencode(params or {})) if q)
        target += f"?{query}" if query else ""
        if self._proxy is not None and self._origin.scheme == "http":
            # Absolute form, without the credentials the url may carry.
            target = f"http://{self._origin.authority}{target}"
        return target

    async def request(
        self,
        method: str,
        path: str = "",
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        body: bytes = b"",
        timeout: float | None = None,
    ) -> Response:
        """Send one request and read the whole response, within the timeout."""
        target = self.target(path, params)
        fields = {**self._headers, **(headers or {})}
        limit = self._timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                try:
                    return await self._exchange(method, target, fields, body)
                except _StaleConnectionError:
                    return await self._exchange(method, target, fields, body)
        except TimeoutError:
            raise RequestTimeoutError(f"no complete response within {limit:g} s") from None
        except (OSError, EOFError, h11.ProtocolError) as exc:
            raise TransportError(_describe(exc)) from exc

    async def aclose(self) -> None:
        connections = [*self._idle, *self._busy]
        self._idle.clear()
        self._busy.clear()
        for connection in connections:
            connection.close()
        for connection in connections:
            with contextlib.suppress(OSError, ssl.SSLError):
                await connection.writer.wait_closed()

    # -- one exchange ---------------------------------------------------------------------------

    async def _checkout(self) -> tuple[_Connection, bool]:
        """An idle connection still worth reusing, else a new one; and whether it is reused."""
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable():
                self._busy.add(connection)
                return connection, True
            connection.close()
        connection = await self._connect()
        self._busy.add(connection)
        return connection, False

    async def _exchange(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes
    ) -> Response:
        connection, reused = await self._checkout()
        done = False
        try:
            response = await self._send(connection, reused, method, target, headers, body)
            conn = connection.h11
            if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                conn.start_next_cycle()
                connection.idle_since = time.monotonic()
                done = True
            return response
        finally:
            # Anything but a clean end (an error, a cancellation, `Connection: close`) leaves
            # the connection in a state nobody can reuse.
            self._busy.discard(connection)
            if done:
                self._idle.append(connection)
            else:
                connection.close()

    async def _send(
        self,
        connection: _Connection,
        reused: bool,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes,
    ) -> Response:
        conn = connection.h11
        names = {name.lower() for name in headers}
        fields = [("host", self._origin.authority)]
        if "user-agent" not in names:
            fields.append(("user-agent", self._user_agent))
        if self._origin.authorization is not None and "authorization" not in names:
            fields.append(("authorization", self._origin.authorization))
        if (
            self._proxy is not None
            and self._proxy.authorization is not None
            and self._origin.scheme == "http"
        ):
            fields.append(("proxy-authorization", self._proxy.authorization))
        fields += headers.items()
        if body or method not in ("GET", "HEAD"):
            fields.append(("content-length", str(len(body))))
        data = conn.send(h11.Request(method=method, target=target, headers=fields)) or b""
        if body:
            data += conn.send(h11.Data(data=body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        try:
            connection.writer.write(data)
            await connection.writer.drain()
            return await self._read_response(connection)
        except (ConnectionError, EOFError, h11.RemoteProtocolError) as exc:
            if reused and conn.their_state is h11.SEND_RESPONSE:
                raise _StaleConnectionError(_describe(exc)) from exc
            raise

    async def _read_response(self, connection: _Connection) -> Response:
        conn = connection.h11
        head: h11.Response | None = None
        chunks: list[bytes] = []
        kept = 0
        truncated = False
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await connection.read()
                if not data and conn.their_state is h11.SEND_RESPONSE:
                    raise EOFError("the server closed the connection without answering")
                conn.receive_data(data)
            elif isinstance(event, h11.Response):
                head = event
            elif isinstance(event, h11.Data):
                room = self._max_body - kept
                truncated = truncated or len(event.data) > room
                if room > 0:
                    chunks.append(bytes(event.data[:room]))
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
        return Response(head.status_code, headers, b"".join(chunks), truncated)

    # -- connecting -----------------------------------------------------------------------------

    def _tls(self) -> ssl.SSLContext:
        """The context of a new connection: the given one, or the newest of a callable (a
        `bridge.infra.tls.ReloadingContext` whose files may have changed), else public CAs."""
        if callable(self._ssl):
            return self._ssl()
        return self._ssl or public_cas()

    async def _connect(self) -> _Connection:
        hop = self._proxy or self._origin
        try:
            reader, writer = await asyncio.open_connection(
                hop.host,
                hop.port,
                ssl=self._tls() if hop.scheme == "https" else None,
                server_hostname=hop.host if hop.scheme == "https" else None,
            )
        except ssl.SSLError as exc:
            raise TransportError(f"TLS with {hop.authority} failed: {_describe(exc)}") from exc
        except socket.gaierror as exc:
            what = "proxy " if hop is self._proxy else ""
            message = f"cannot resolve {what}{hop.host} (DNS): {_describe(exc)}"
            raise NameResolutionError(message, hop.host) from exc
        except OSError as exc:
            what = "proxy " if hop is self._proxy else ""
            message = f"cannot connect to {what}{hop.authority}: {_describe(exc)}"
            raise TransportError(message) from exc
        connection = _Connection(reader, writer)
        if self._proxy is not None and self._origin.scheme == "https":
            try:
                await self._tunnel(connection)
                await writer.start_tls(self._tls(), server_hostname=self._origin.host)
            except BaseException:
                connection.close()
                raise
            connection = _Connection(reader, writer)
        return connection

    async def _tunnel(self, connection: _Connection) -> None:
        """Ask the proxy for a tunnel to the origin (CONNECT); TLS then runs inside it."""
        assert self._proxy is not None
        authority = self._origin.address
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
                data = await connection.read()
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


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
