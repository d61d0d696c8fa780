"""The HTTP client's fast path (`bridge.infra.http1.parse_head`, `encode_request`) against h11.

The fast path reads plain answers (a final status, Content-Length or no body, CRLF lines of
ASCII) without h11 and hands everything else to h11. Its promise is that it never reads an
answer differently from h11: h11 is the oracle here. Hypothesis writes answers, well-formed
and not, and wherever the fast path accepts one, h11 must read the same status, headers,
body and keep-alive verdict from the same bytes. The request writer must write the bytes
h11 would write, or decline. Then the client end to end, against real sockets on 127.0.0.1
that answer in the ways the fast path hands over (chunked, close-delimited, 1xx, bare LF)
or must not trust (bytes past the answer, a short body).
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import h11
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bridge.infra import http1
from bridge.infra.http1 import Head, encode_request, parse_head

# -- what h11 reads ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Read:
    status: int
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


def h11_reads(method: str, data: bytes) -> Read | None:
    """What h11 (as the client reads it) makes of `data` answering `method`: None when it
    refuses it or needs more bytes than `data` holds."""
    conn = h11.Connection(h11.CLIENT)
    body = b"" if method in ("GET", "HEAD") else b"x"
    fields = [("host", "example")] + ([("content-length", "1")] if body else [])
    conn.send(h11.Request(method=method, target="/", headers=fields))
    if body:
        conn.send(h11.Data(data=body))
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    head: h11.Response | None = None
    chunks: list[bytes] = []
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return None
            if isinstance(event, h11.Response):
                head = event
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
    except h11.RemoteProtocolError:
        return None
    assert head is not None
    headers: dict[str, str] = {}
    for name, value in head.headers:
        key, text = name.decode("ascii"), value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    keep_alive = conn.our_state is h11.DONE and conn.their_state is h11.DONE
    return Read(head.status_code, headers, b"".join(chunks), keep_alive)


def fast_reads(method: str, data: bytes) -> Read | None:
    """What the fast path makes of `data` (head and body), None when it hands it to h11."""
    end = data.find(b"\r\n\r\n")
    if end < 0 or b"\n\n" in data[: end + 4]:
        return None
    head = parse_head(data[: end + 4], method)
    if head is None:
        return None
    body = data[end + 4 : end + 4 + head.length]
    if len(body) < head.length:
        return None  # the client would read on (the strategy caps bodies at 64 bytes)
    return Read(head.status, head.headers, body, head.keep_alive)


# -- answers, plain and odd ----------------------------------------------------------------------

_NAMES = st.sampled_from(
    ["Content-Type", "content-length", "Content-Length", "Connection", "connection",
     "Transfer-Encoding", "ETag", "Metadata-Flavor", "X-Odd_Name!", "Bad Name", "", "a:b"]
)  # fmt: skip
_VALUES = st.one_of(
    st.sampled_from(
        ["0", "1", "12", " 5 ", "5, 5", "5,6", "-1", "0x10", "close", "keep-alive",
         "Close, Upgrade", "keep-alive,close", "chunked", "Google", "a  b", "\tx\t",
         "", "99999999999999999999", "caf\xe9", "a\x7fb", "a\x00b", "a\rb", "a\nb"]
    ),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=255), max_size=12),
)  # fmt: skip
_STATUS_LINES = st.one_of(
    st.builds(
        lambda version, status, reason: f"HTTP/{version} {status}{reason}",
        st.sampled_from(["1.1", "1.0", "2.0", "1.2", "11", "1.1 "]),
        st.integers(min_value=0, max_value=1000),
        st.sampled_from([" OK", "", " ", " No Content", " a\tb", " caf\xe9", " x\x00"]),
    ),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=255), max_size=20),
)
_EOLS = st.sampled_from(["\r\n", "\r\n", "\r\n", "\n", "\r", " \r\n"])


@st.composite
def answers(draw: st.DrawFn) -> tuple[str, bytes]:
    """A request method and an answer's bytes: status line, header lines (line endings
    mostly CRLF), the empty line, and as many body bytes as its Content-Length (if one
    parses) claims, at most 64."""
    method = draw(st.sampled_from(["GET", "POST", "HEAD", "PUT"]))
    lines = [draw(_STATUS_LINES)]
    for _ in range(draw(st.integers(min_value=0, max_value=5))):
        lines.append(f"{draw(_NAMES)}:{draw(st.sampled_from(['', ' ', '  ']))}{draw(_VALUES)}")
    eol = draw(_EOLS)
    head = "".join(line + draw(st.one_of(st.just(eol), _EOLS)) for line in lines)
    head += draw(st.sampled_from(["\r\n", "\r\n", "\n", " \r\n"]))
    data = head.encode("latin-1")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.lower() == "content-length" and re.fullmatch("[0-9]+", value.strip()):
            length = max(length, min(int(value.strip()), 64))
    body = draw(st.binary(min_size=length, max_size=length))
    return method, data + body


def plain(status: int, headers: list[tuple[str, str]], body: bytes, version: str = "1.1") -> bytes:
    lines = [f"HTTP/{version} {status} Whatever"] + [f"{n}: {v}" for n, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@settings(max_examples=1500, deadline=None)
@given(answers())
@example(("GET", plain(200, [("Content-Length", "2")], b"ok")))
@example(("HEAD", plain(200, [("Content-Length", "2")], b"")))
@example(("GET", plain(204, [("Connection", "close")], b"")))
@example(("GET", plain(200, [("Content-Length", "0")], b"", version="1.0")))
@example(("GET", plain(200, [("Content-Length", "2"), ("Content-Length", "2")], b"ok")))
@example(("GET", plain(200, [("Transfer-Encoding", "chunked")], b"0\r\n\r\n")))
@example(("GET", plain(200, [("ETag", "1"), ("etag", "2"), ("Content-Length", "0")], b"")))
@example(("GET", b"HTTP/1.1 200 OK\nContent-Length: 0\n\n"))
@example(("GET", b"HTTP/1.1 200 OK\r\nContent-Length: 0\n\r\n"))
def test_whatever_the_fast_path_reads_h11_reads_the_same(answer: tuple[str, bytes]) -> None:
    method, data = answer
    fast = fast_reads(method, data)
    if fast is not None:
        assert h11_reads(method, data) == fast


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["GET", "HEAD", "POST"]),
    st.sampled_from([200, 201, 202, 204, 304, 404, 410, 503]),
    st.lists(
        st.tuples(
            st.sampled_from(["Content-Type", "ETag", "Retry-After", "Location", "Server"]),
            st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=9),
        ),
        max_size=4,
    ),
    st.binary(max_size=64),
    st.sampled_from(["1.1", "1.0"]),
    st.sampled_from([[], [("Connection", "close")], [("Connection", "keep-alive")]]),
)
def test_plain_answers_are_read_by_the_fast_path(
    method: str,
    status: int,
    headers: list[tuple[str, str]],
    body: bytes,
    version: str,
    connection: list[tuple[str, str]],
) -> None:
    """The answers metadata servers and webhook receivers send do take the fast path."""
    bodiless = method == "HEAD" or status in (204, 304)
    sent = b"" if bodiless else body
    data = plain(status, [*headers, *connection, ("Content-Length", str(len(body)))], sent, version)
    fast = fast_reads(method, data)
    assert fast is not None
    assert fast == h11_reads(method, data)
    assert fast.body == sent


_FIELD_TEXT = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x2FF), max_size=10)


@settings(max_examples=800, deadline=None)
@given(
    st.sampled_from(["GET", "POST", "PUT", "G ET", "", "GET\r\n"]),
    st.one_of(st.sampled_from(["/", "/a?b=c&d=%20", "/x y", "", "/\x7f", "/caf\xe9"]), _FIELD_TEXT),
    st.lists(
        st.tuples(
            st.one_of(st.sampled_from(["content-type", "ce-id", "X-Key", "bad name"]), _FIELD_TEXT),
            st.one_of(st.sampled_from(["application/json", "a b", " lead", "x\r\ny"]), _FIELD_TEXT),
        ),
        max_size=4,
    ),
    st.binary(max_size=20),
)
def test_the_fast_writer_writes_what_h11_writes_or_declines(
    method: str, target: str, extra: list[tuple[str, str]], body: bytes
) -> None:
    fields = [("host", "127.0.0.1:8080"), ("user-agent", "test/1"), *extra]
    if body or method not in ("GET", "HEAD"):
        fields.append(("content-length", str(len(body))))
    data = encode_request(method, target, fields, body)
    if data is None:
        return
    conn = h11.Connection(h11.CLIENT)
    expected = conn.send(h11.Request(method=method, target=target, headers=fields)) or b""
    if body:
        expected += conn.send(h11.Data(data=body)) or b""
    expected += conn.send(h11.EndOfMessage()) or b""
    assert data == expected


def test_the_fast_path_keeps_to_its_subset() -> None:
    """Spelled out: what it hands to h11 rather than read itself."""
    handed_over = [
        plain(100, [], b""),  # an interim answer: h11 skips it and reads the final one
        plain(200, [("Transfer-Encoding", "chunked")], b""),
        plain(200, [], b""),  # no length: the body runs to the end of the connection
        plain(200, [("Content-Length", "1, 1")], b"x"),
        plain(200, [("Content-Length", "1"), ("content-length", "1")], b"x"),
        plain(200, [("X-Name", "caf\xe9"), ("Content-Length", "0")], b""),
        plain(200, [("Content-Length", "0")], b"", version="2.0"),
        b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 0\r\n\r\n",
    ]
    for data in handed_over:
        end = data.index(b"\r\n\r\n") + 4
        assert parse_head(data[:end], "GET") is None, data
    assert parse_head(plain(200, [("Content-Length", "5")], b""), "HEAD") == Head(
        200, {"content-length": "5"}, 0, keep_alive=True
    )


# -- the client, end to end ----------------------------------------------------------------------

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def answering(*answers: bytes) -> AsyncIterator[tuple[str, list[int]]]:
    """A server on 127.0.0.1 that reads each request (head, Content-Length body) and writes
    the next of `answers`, in pieces where the answer holds a `|` (and closes the connection
    after an HTTP/1.0 one); yields its url and the number of requests each connection served."""
    pending = list(answers)
    served: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.append(0)
        index = len(served) - 1
        try:
            while pending:
                head = await reader.readuntil(b"\r\n\r\n")
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        await reader.readexactly(int(line.split(b":")[1]))
                served[index] += 1
                answer = pending.pop(0)
                for piece in answer.split(b"|"):
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.005)
                if answer.startswith(b"HTTP/1.0"):
                    break  # an HTTP/1.0 server closes after each answer
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/", served
    finally:
        server.close()


async def requests(url: str, count: int, max_body: int = http1.MAX_BODY) -> list[http1.Response]:
    client = http1.Http1Client(url, timeout=5.0, user_agent="test", max_body=max_body)
    try:
        return [await client.request("POST", body=b"{}") for _ in range(count)]
    finally:
        await client.aclose()


async def test_answers_in_pieces_and_odd_framings_are_read_on_one_connection() -> None:
    async with answering(
        b"HTTP/1.1 200 OK\r\nContent-|Length: 5\r\n\r|\nhel|lo",  # the head split anywhere
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 1\r\n\r\nx",
        b"HTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\nContent-Length: 2\n\nLF",
        b"HTTP/1.1 204 No Content\r\n\r\n",
    ) as (url, served):
        answers = await requests(url, 5)
    assert [(a.status, a.body) for a in answers] == [
        (200, b"hello"), (201, b"x"), (202, b"abc"), (200, b"LF"), (204, b"")
    ]  # fmt: skip
    assert served == [5]


async def test_a_close_delimited_body_is_read_to_the_end_and_the_connection_dropped() -> None:
    async with answering(
        b"HTTP/1.0 200 OK\r\n\r\nuntil the end", b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"
    ) as (url, served):
        answers = await requests(url, 2)
    assert [a.body for a in answers] == [b"until the end", b"ok"]
    assert served == [1, 1]


async def test_bytes_past_an_answer_are_never_read_as_the_next_one() -> None:
    async with answering(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 410 Gone\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nnew",
    ) as (url, served):
        answers = await requests(url, 2)
    assert [(a.status, a.body) for a in answers] == [(200, b"ok"), (200, b"new")]
    assert served == [1, 1]


async def test_a_body_beyond_the_limit_is_read_and_dropped_and_the_connection_kept() -> None:
    async with answering(
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123|456789",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
    ) as (url, served):
        answers = await requests(url, 2, max_body=4)
    assert [(a.body, a.truncated) for a in answers] == [(b"0123", True), (b"abc", False)]
    assert served == [2]


async def test_an_answer_cut_short_is_a_transport_error() -> None:
    async with answering(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort") as (url, _):
        with pytest.raises(http1.TransportError, match="mid-response"):
            await requests(url, 1)


async def test_connection_close_is_honoured() -> None:
    async with answering(
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    ) as (url, served):
        await requests(url, 2)
    assert served == [1, 1]


async def test_a_request_leaves_in_one_send_with_nagle_off() -> None:
    """Head and body in one segment, and nothing held back by Nagle's algorithm waiting for
    the receiver's delayed acknowledgement (asyncio sets TCP_NODELAY on its TCP sockets;
    pinned here because the client relies on it)."""
    first_reads: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first_reads.append(await reader.read(65536))
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    client = http1.Http1Client(
        f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/", timeout=5.0, user_agent="t"
    )
    try:
        connection, _ = await client._checkout()
        sock = connection.writer.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        client._busy.discard(connection)
        client._idle.append(connection)
        response = await client.request("POST", body=b'{"a": 1}')
    finally:
        await client.aclose()
        server.close()
    assert response.status == 204
    assert first_reads[0].endswith(b'\r\n\r\n{"a": 1}')
