"""The one HTTP/1.1 client of the bridge: a fast path and h11 for the protocol, asyncio streams
for the socket.

Both of the bridge's HTTP conversations are with one origin each, at a steady pace: the
metadata watchers poll (Azure once a second, for the life of the VM) and the webhook sink
drains its backlog one request at a time. So the client's per-request cost is the idle CPU
of every VM and the drain rate of every backlog, and its import is part of every start-up.
Measured on loopback: httpx (httpcore + anyio) spends about 0.6 ms of CPU per request,
capped a webhook drain near 1,200 events/s and cost 47 ms and 5 MiB to import; h11 driven
directly over asyncio streams spends about 0.14 ms and 7 ms; aiohttp's client is as fast but
adds 12 MiB of resident memory. The protocol itself (framing, chunked and close-delimited
bodies, keep-alive rules, header validation) is h11's, a sans-IO implementation of RFC 9112;
this module owns the connections, TLS, the proxy and the timeouts, and a fast path for the
plain case: requests whose fields are plain ASCII are written by `encode_request` (the bytes
h11 would write), and answers with a final status, framed by Content-Length or bodiless, in
CRLF lines of ASCII (what metadata servers and webhook receivers send) are read by
`parse_head`: a webhook drain spends a fifth to a third less CPU per request. Everything
else (1xx, chunked, close-delimited, folded or non-ASCII headers, any doubt) goes to h11
with the bytes read so far, and the fast path never reads an answer differently from h11
(tests/test_http1_fast.py, with h11 as the oracle). h11 itself is imported at the first
answer that needs it: a sidecar whose metadata server and receiver answer plainly
never loads it, and keeps its 0.3 MiB.

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
- A request may ask for a connection of its own (`fresh`): the GCE watcher's long polls,
  whose answer is a notice. Even with `TCP_QUICKACK` (below), Linux acknowledges an answer's
  head on a kept connection only when the event loop reads it, so a server that writes the
  head and the body in two sends with Nagle's algorithm on holds the body back until then:
  a second wake-up and read on every notice's way. The first data a connection receives is
  acknowledged on arrival, so there the body follows the head at once (about 0.3 ms of the
  bridge's part against `http.server`, bench/spans.py). Opening it is paid when the long
  poll is sent; the connection is kept after its answer and closed once the next fresh
  request is sent, so that neither side's teardown falls on the notice's way either.
  Google's own sample opens a connection per long poll too.
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
import re
import socket
import ssl
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import SplitResult, unquote, urlencode, urlsplit

if TYPE_CHECKING:
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
    """One TCP (maybe TLS) connection, read by the fast path or by h11 (see `_read`)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = time.monotonic()
        #: Some byte of the current exchange's answer arrived (a reused connection that
        #: closes before any is safe to send the request again on a fresh one).
        self.answered = False
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
        data = await self.reader.read(_READ_SIZE)
        self.answered = self.answered or bool(data)
        return data

    def reusable(self) -> bool:
        fresh = time.monotonic() - self.idle_since < KEEPALIVE_EXPIRY
        return fresh and not self.reader.at_eof()

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
        #: Fresh connections done with their answer, closed once the next fresh request
        #: is sent (see the module docstring).
        self._retired: list[_Connection] = []

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
        fresh: bool = False,
    ) -> Response:
        """Send one request and read the whole response, within the timeout; with `fresh`,
        on a new connection of its own (see the module docstring)."""
        target = self.target(path, params)
        fields = {**self._headers, **(headers or {})}
        limit = self._timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                try:
                    return await self._exchange(method, target, fields, body, fresh)
                except _StaleConnectionError:
                    return await self._exchange(method, target, fields, body, fresh)
        except TimeoutError:
            raise RequestTimeoutError(f"no complete response within {limit:g} s") from None
        except Exception as exc:
            if isinstance(exc, (OSError, EOFError)) or _h11_error(exc, "ProtocolError"):
                raise TransportError(_describe(exc)) from exc
            raise

    async def aclose(self) -> None:
        connections = [*self._idle, *self._busy, *self._retired]
        self._idle.clear()
        self._busy.clear()
        self._retired.clear()
        for connection in connections:
            connection.close()
        for connection in connections:
            with contextlib.suppress(OSError, ssl.SSLError):
                await connection.writer.wait_closed()

    # -- one exchange ---------------------------------------------------------------------------

    async def _checkout(self, fresh: bool = False) -> tuple[_Connection, bool]:
        """An idle connection still worth reusing (never for a `fresh` request), else a new
        one; and whether it is reused."""
        while self._idle and not fresh:
            connection = self._idle.pop()
            if connection.reusable():
                self._busy.add(connection)
                return connection, True
            connection.close()
        connection = await self._connect()
        self._busy.add(connection)
        return connection, False

    async def _exchange(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes, fresh: bool = False
    ) -> Response:
        connection, reused = await self._checkout(fresh)
        if fresh and self._retired:  # closed right after this request is written
            asyncio.get_running_loop().call_soon(self._close_retired)
        keep = False
        try:
            response, keep = await self._send(connection, reused, method, target, headers, body)
            connection.idle_since = time.monotonic()
            return response
        finally:
            # Anything but a clean end (an error, a cancellation, `Connection: close`, bytes
            # past the answer) leaves the connection in a state nobody can reuse.
            self._busy.discard(connection)
            if keep and fresh:
                self._retired.append(connection)
            elif keep:
                self._idle.append(connection)
            else:
                connection.close()

    def _close_retired(self) -> None:
        retired, self._retired = self._retired, []
        for connection in retired:
            connection.close()

    async def _send(
        self,
        connection: _Connection,
        reused: bool,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes,
    ) -> tuple[Response, bool]:
        """Write the request in one piece and read its answer; and whether the connection
        may serve another request."""
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
        request = _Request(method, target, fields, body)
        data = None if names & _FRAMING else encode_request(method, target, fields, body)
        conn: h11.Connection | None = None
        if data is None:
            conn, data = request.through_h11()
        connection.answered = False
        try:
            connection.writer.write(data)
            await connection.writer.drain()
            if conn is None:
                return await self._read(connection, request)
            return await self._read_h11(connection, conn)
        except Exception as exc:
            closed = isinstance(exc, (ConnectionError, EOFError))
            if (
                (closed or _h11_error(exc, "RemoteProtocolError"))
                and reused
                and not connection.answered
            ):
                raise _StaleConnectionError(_describe(exc)) from exc
            raise

    async def _read(self, connection: _Connection, request: _Request) -> tuple[Response, bool]:
        """The answer, by the fast path when it is a plain one (a final status, framed by
        Content-Length or bodiless, CRLF lines of ASCII: what metadata servers and webhook
        receivers send), else by h11 from the bytes read so far. h11's protocol work was the
        largest part of the bridge's own cost per request (about 0.2 ms of a drain's 0.5 ms
        an event under the profiler); the fast path does the same reading in a few regular
        expressions."""
        buffer = b""
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            if len(buffer) > MAX_HEAD or b"\n\n" in buffer:
                return await self._read_h11(connection, request.through_h11()[0], buffer)
            data = await connection.read()
            if not data:
                if not buffer:
                    raise EOFError("the server closed the connection without answering")
                return await self._read_h11(connection, request.through_h11()[0], buffer)
            buffer += data
        end += 4
        head = None if end > MAX_HEAD else parse_head(buffer[:end], request.method)
        if head is None or b"\n\n" in buffer[:end]:
            return await self._read_h11(connection, request.through_h11()[0], buffer)
        kept = bytearray(buffer[end : end + head.length][: self._max_body])
        received = len(buffer) - end
        while received < head.length:
            data = await connection.read()
            if not data:
                raise EOFError("the server closed the connection mid-response")
            received += len(data)
            room = self._max_body - len(kept)
            if room > 0:
                kept += data[: min(room, head.length - (received - len(data)))]
        truncated = head.length > self._max_body
        # Bytes past the answer belong to no request of ours: the connection is not reused.
        keep = head.keep_alive and received == head.length
        return Response(head.status, head.headers, bytes(kept), truncated), keep

    async def _read_h11(
        self, connection: _Connection, conn: h11.Connection, buffered: bytes = b""
    ) -> tuple[Response, bool]:
        """The answer read by h11 (`conn` has sent the request), `buffered` its first bytes."""
        import h11  # at the first answer that needs it (see the module docstring)

        if buffered:
            conn.receive_data(buffered)
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
        keep = conn.our_state is h11.DONE and conn.their_state is h11.DONE
        return Response(head.status_code, headers, b"".join(chunks), truncated), keep

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
        import h11  # at the first answer that needs it (see the module docstring)

        authority = self._origin.address
        fields = [("host", authority), ("user-agent", self._user_agent)]
        if self._proxy.authorization is not None:
            fields.append(("proxy-authorization", self._proxy.authorization))
        conn = h11.Connection(h11.CLIENT)
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


@dataclass(frozen=True, slots=True)
class _Request:
    """A request as sent, kept so that h11 can take over reading its answer."""

    method: str
    target: str
    fields: list[tuple[str, str]]
    body: bytes

    def through_h11(self) -> tuple[h11.Connection, bytes]:
        """A client h11 state machine that has sent this request, and the bytes it wrote
        (h11 validates the request: what it refuses raises `h11.LocalProtocolError`)."""
        import h11  # at the first answer that needs it (see the module docstring)

        conn = h11.Connection(h11.CLIENT)
        data = conn.send(h11.Request(method=self.method, target=self.target, headers=self.fields))
        data = data or b""
        if self.body:
            data += conn.send(h11.Data(data=self.body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        return conn, data


# -- the fast path: plain answers parsed without h11 -------------------------------------------

#: A response head longer than this is left to h11 (its own limit for an incomplete head).
MAX_HEAD: Final = 16 * 1024
#: RFC 9110 token (a header name, a method); RFC 9112 field value without its outer blanks;
#: a request target of visible ASCII. Each is a subset of what h11 accepts (h11 also allows
#: DEL and obs-text in values): what the fast path does not accept goes to h11, which
#: accepts it or refuses it with its own reason.
_TOKEN: Final = re.compile(r"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_VALUE: Final = re.compile(r"(?:[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*)?")
_TARGET: Final = re.compile(r"[\x21-\x7e]+")
_STATUS_LINE: Final = re.compile(rb"HTTP/1\.([01]) ([2-5][0-9][0-9])(?: [\t\x20-\x7e]*)?")
_HEADER_LINE: Final = re.compile(
    rb"([-!#$%&'*+.^_`|~0-9A-Za-z]+):[ \t]*((?:[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*)?)[ \t]*"
)
_DIGITS: Final = re.compile(rb"[0-9]{1,19}")
#: Request headers whose framing or connection meaning the fast writer leaves to h11.
_FRAMING: Final = frozenset({"host", "content-length", "transfer-encoding", "connection"})


def encode_request(
    method: str, target: str, fields: list[tuple[str, str]], body: bytes
) -> bytes | None:
    """The request's bytes exactly as h11 writes them (Host first, then the fields in
    order), or None when anything is outside the plain subset: then h11 writes it, or
    refuses it with its reason. `fields` start with the Host header and hold the
    Content-Length the client computed; the caller's own fields never carry either."""
    if not _TOKEN.fullmatch(method) or not _TARGET.fullmatch(target):
        return None
    lines = [f"{method} {target} HTTP/1.1"]
    for name, value in fields:
        if not _TOKEN.fullmatch(name) or not _VALUE.fullmatch(value):
            return None
        lines.append(f"{name}: {value}")
    lines.append("\r\n")
    try:
        head = "\r\n".join(lines).encode("ascii")
    except UnicodeEncodeError:
        return None
    return head + body if body else head


@dataclass(frozen=True, slots=True)
class Head:
    """A response head the fast path understood: a final status and a plain framing."""

    status: int
    headers: dict[str, str]
    #: Bytes of body that follow (0 for HEAD, 204 and 304).
    length: int
    #: The server lets the connection be used again (HTTP/1.1 without `Connection: close`).
    keep_alive: bool


def parse_head(head: bytes, method: str) -> Head | None:
    """The head (status line and header lines, each ended by CRLF, then an empty line) of a
    final answer framed by Content-Length or bodiless; None for anything else, which h11
    then reads (1xx, chunked, close-delimited, obs-fold, bare LF, odd versions, repeated
    or listed Content-Length, bytes outside ASCII). Whatever this returns, h11 reads the
    same way (pinned with h11 as the oracle in tests/test_http1_fast.py)."""
    if not head.endswith(b"\r\n\r\n"):
        return None
    lines = head[:-4].split(b"\r\n")
    status_line = _STATUS_LINE.fullmatch(lines[0])
    if status_line is None:
        return None
    status = int(status_line[2])
    headers: dict[str, str] = {}
    length: bytes | None = None
    close = False
    for line in lines[1:]:
        field = _HEADER_LINE.fullmatch(line)
        if field is None:
            return None
        name = field[1].lower().decode("ascii")
        value = field[2]
        if name == "content-length":
            if length is not None or not _DIGITS.fullmatch(value):
                return None
            length = value
        elif name == "transfer-encoding":
            return None
        elif name == "connection":
            close = close or b"close" in (token.strip() for token in value.lower().split(b","))
        text = value.decode("ascii")
        headers[name] = f"{headers[name]}, {text}" if name in headers else text
    if status in (204, 304) or method == "HEAD":
        size = 0
    elif length is None:
        return None  # close-delimited: h11 reads it to the end
    else:
        size = int(length)
    return Head(status, headers, size, keep_alive=status_line[1] == b"1" and not close)


def _h11_error(exc: BaseException, name: str) -> bool:
    """Whether `exc` is h11's exception `name`: never before h11 was imported, since only
    h11 raises its exceptions."""
    module = sys.modules.get("h11")
    return module is not None and isinstance(exc, getattr(module, name))


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
