"""The bridge's HTTP/1.1 client (`bridge.infra.http1`) under the webhook sink, against real servers.

The sink-level behaviour (status codes, signing, TLS, the plain proxy) is pinned in
test_webhook.py; these tests pin what the connection layer adds: tunnels through a proxy,
credentials from urls, keep-alive expiry, connections the server closed, odd answers.
Servers here are real sockets on 127.0.0.1; the raw ones speak deliberately bad HTTP.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from bridge.infra import http1
from bridge.sinkapi import Ok, Retry
from tests.factories import sample_events
from tests.sinks.test_webhook import make_sink, self_signed
from tests.sinks.webhook_receiver import RecordingProxy, WebhookReceiver, serving

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[str]:
    """A TCP server on 127.0.0.1 running `handler` per connection; yields its /hook url."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request (head and content-length body); b"" when the client closed."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head + await reader.readexactly(length)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def test_https_through_a_proxy_runs_tls_end_to_end_in_a_connect_tunnel(
    tmp_path: Path,
) -> None:
    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    receiver = await WebhookReceiver(context).start()
    proxy = await RecordingProxy().start()
    try:
        proxy_url = proxy.url.replace("http://", "http://squid:s%3Acret@")
        sink = make_sink(receiver.url, proxy=proxy_url, ca_bundle=str(cert))
        assert await sink.publish(sample_events(1)) == Ok()
        assert await sink.publish(sample_events(2)[1:]) == Ok()
        await sink.close(1.0)
        assert proxy.request_lines == [f"CONNECT 127.0.0.1:{receiver.port} HTTP/1.1"]
        assert proxy.authorizations == [basic("squid", "s:cret")]
        assert len(receiver.posts()) == 2
        assert "proxy-authorization" not in receiver.posts()[0].headers
    finally:
        await proxy.stop()
        await receiver.stop()


async def test_an_https_proxy_wraps_the_tunnel_in_its_own_tls(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    receiver = await WebhookReceiver(context).start()
    proxy = await RecordingProxy(context).start()
    try:
        sink = make_sink(receiver.url, proxy=proxy.url, ca_bundle=str(cert))
        assert await sink.publish(sample_events(1)) == Ok()
        await sink.close(1.0)
        assert proxy.request_lines == [f"CONNECT 127.0.0.1:{receiver.port} HTTP/1.1"]
        assert len(receiver.posts()) == 1
    finally:
        await proxy.stop()
        await receiver.stop()


async def test_a_proxy_refusing_the_tunnel_is_a_retry_naming_it(tmp_path: Path) -> None:
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    async with raw_server(refuse) as url:
        proxy = url.removesuffix("/hook")
        sink = make_sink("https://127.0.0.1:1/hook", proxy=proxy)
        result = await sink.publish(sample_events(1))
        await sink.close(1.0)
    assert isinstance(result, Retry)
    assert "refused the tunnel" in result.reason
    assert "407" in result.reason


async def test_credentials_in_the_url_are_sent_as_basic_authorization(
    receiver: WebhookReceiver,
) -> None:
    sink = make_sink(receiver.url.replace("http://", "http://ops:pa%20ss@"))
    assert await sink.publish(sample_events(1)) == Ok()
    await sink.close(1.0)
    assert receiver.posts()[0].headers["authorization"] == basic("ops", "pa ss")


async def test_a_connection_the_server_closed_is_replaced_and_nothing_is_sent_twice() -> None:
    """The server answers, then hangs up without saying so (no `Connection: close`).

    Whether the sink notices the hang-up before sending or only when its next request meets
    a dead socket, every event arrives exactly once and every publish is Ok.
    """
    received: list[bytes] = []

    async def answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await read_request(reader))
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()
        writer.close()

    async with raw_server(answer_once) as url:
        sink = make_sink(url)
        for event in sample_events(5):
            assert await sink.publish([event]) == Ok()
        await asyncio.sleep(0.05)  # the hang-up has surely been seen now
        assert await sink.publish(sample_events(6)[5:]) == Ok()
        await sink.close(1.0)
    assert len(received) == 6
    assert len({request.split(b"\r\n\r\n", 1)[1] for request in received}) == 6


async def test_an_idle_connection_is_replaced_after_the_keepalive_expiry(
    receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http1, "KEEPALIVE_EXPIRY", 0.1)
    sink = make_sink(receiver.url)
    events = sample_events(3)
    assert await sink.publish(events[:1]) == Ok()
    assert await sink.publish(events[1:2]) == Ok()
    await asyncio.sleep(0.2)
    assert await sink.publish(events[2:]) == Ok()
    await sink.close(1.0)
    first, second, third = (post.peer_port for post in receiver.posts())
    assert first == second != third


async def test_a_long_chunked_answer_is_read_whole_and_the_connection_kept() -> None:
    peers: list[int] = []

    async def chatty(request: web.Request) -> web.StreamResponse:
        await request.read()
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername")[1])
        response = web.StreamResponse(status=202)
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(40):
            await response.write(b"x" * 10_000)  # 400 kB, more than the sink keeps
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/hook", chatty)
    async with serving(app) as url:
        sink = make_sink(url)
        for event in sample_events(3):
            assert await sink.publish([event]) == Ok()
        await sink.close(1.0)
    assert len(peers) == 3
    assert len(set(peers)) == 1


async def test_a_malformed_answer_is_a_retry_and_the_connection_is_dropped() -> None:
    connections = 0

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        writer.write(b"HTTP/1.1 two hundred\r\n\r\n")
        await writer.drain()

    async with raw_server(garbage) as url:
        sink = make_sink(url)
        results = [await sink.publish([event]) for event in sample_events(2)]
        await sink.close(1.0)
    for result in results:
        assert isinstance(result, Retry)
        assert result.reason.startswith("cannot reach http://127.0.0.1:")
    assert connections == 2
