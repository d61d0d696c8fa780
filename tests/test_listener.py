"""The listener answers every request, good or bad, and never dies of one.

Real sockets on loopback: well-formed GETs through httpx, malformed and abusive requests
written by hand on a raw connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from bridge.surface.listener import Listener, ListenerError, Request, Response


async def _ok(request: Request) -> Response:
    return Response.json(200, {"path": request.path, "query": dict(request.query)})


async def _broken(_request: Request) -> Response:
    raise RuntimeError("a bug in a handler")


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    server = Listener("127.0.0.1", 0, {"/ok": _ok, "/broken": _broken}, read_timeout=0.3)
    await server.start()
    yield server
    await server.stop()


async def _raw(listener: Listener, data: bytes) -> bytes:
    host, port = listener.address
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(data)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer


async def test_a_get_reaches_its_handler_with_the_query(listener: Listener) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.get(listener.url + "/ok?horizon=60")
    assert response.status_code == 200
    assert response.json() == {"path": "/ok", "query": {"horizon": "60"}}
    assert response.headers["cache-control"] == "no-store"


async def test_head_gets_the_headers_without_the_body(listener: Listener) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.head(listener.url + "/ok")
    assert response.status_code == 200
    assert int(response.headers["content-length"]) > 0
    assert response.content == b""


async def test_unknown_paths_and_methods_are_refused_with_what_is_served(
    listener: Listener,
) -> None:
    async with httpx.AsyncClient() as client:
        missing = await client.get(listener.url + "/nope")
        posted = await client.post(listener.url + "/ok", content=b"")
    assert missing.status_code == 404
    assert "/ok" in missing.text
    assert posted.status_code == 405
    assert posted.headers["allow"] == "GET, HEAD"


async def test_a_failing_handler_is_a_500_and_the_listener_keeps_serving(
    listener: Listener, caplog: pytest.LogCaptureFixture
) -> None:
    async with httpx.AsyncClient() as client:
        broken = await client.get(listener.url + "/broken")
        after = await client.get(listener.url + "/ok")
    assert broken.status_code == 500
    assert "a bug in a handler" not in broken.text  # details go to the log, not the client
    assert "a bug in a handler" in caplog.text
    assert after.status_code == 200


async def test_garbage_an_oversized_head_and_a_silent_client_get_clear_errors(
    listener: Listener,
) -> None:
    assert (await _raw(listener, b"HELLO\r\n\r\n")).startswith(b"HTTP/1.1 400")
    huge = b"GET /ok HTTP/1.1\r\nX-Pad: " + b"a" * 20_000 + b"\r\n\r\n"
    assert (await _raw(listener, huge)).startswith(b"HTTP/1.1 431")
    assert (await _raw(listener, b"GET /ok HTTP/1.1\r\n")).startswith(b"HTTP/1.1 408")
    body = b"GET /ok HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
    assert (await _raw(listener, body)).startswith(b"HTTP/1.1 400")


async def test_a_port_in_use_is_a_clear_error(listener: Listener) -> None:
    _host, port = listener.address
    second = Listener("127.0.0.1", port, {})
    with pytest.raises(ListenerError, match=r"cannot listen on 127\.0\.0\.1:\d+.*listener\.port"):
        await second.start()
