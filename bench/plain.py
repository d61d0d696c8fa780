"""The plain-server variant: Python's `http.server` as the metadata server and the receiver.

Our simulator and receiver (aiohttp) write each answer in one piece. Many real servers do
not: `http.server`, werkzeug (Flask's server) and others write an answer's head and body in
two `send` calls, with Nagle's algorithm on. On a kept-alive connection that meets the
client's delayed acknowledgements (see `bridge.infra.http1`), which one-piece servers never show,
so the benchmark also runs against these:

- `PlainFront`: a `ThreadingHTTPServer` (HTTP/1.1, keep-alive, Nagle on: `http.server` as
  it comes) in front of a simulator. Each request is forwarded to the simulator, which keeps
  the fidelity (ETags, long polls, vendor headers), and its answer is written back the
  `http.server` way: `send_response`, `send_header`, `end_headers` (one send), then
  `wfile.write(body)` (a second). The front keeps its own request log, stamped when it
  writes the head, so a plain run's poll wait ends when the plain server answers and the
  forwarding hop counts as poll wait, not as the client's part.
- `python -m bench.plain PORT`: the webhook receiver of `bench.receiver` (same paths, same
  records, so `bench.receiver.Receiver` drives it) on `http.server`. A webhook is answered
  the way a minimal receiver does, `204 No Content` (a head, no body), on a kept connection.
  One whose name starts with `ANSWERED` (`drain-answered...`) is answered the way
  `http.server` does as it comes (its default protocol, HTTP/1.0): `200 OK` with a short
  JSON body, the head in one send and the body in another, and the connection closed after
  each answer, so every request pays a new connection. The driver's own
  endpoints (`/records`, `/wait`) answer in one write, so that timing the bridge does not
  slow the driver down.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qsl, urlsplit

from bench.receiver import Record, records_of

if TYPE_CHECKING:
    from bridge.simulator import Simulator

#: Headers that describe one hop (the front writes its own framing and date).
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "content-length", "transfer-encoding", "date", "server"}
)
#: Webhook names the plain receiver answers with a head and a body, in two sends.
ANSWERED = "drain-answered"


class Answer(Protocol):
    """What the latency benchmark reads of a logged request (simulator's or front's)."""

    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def query(self) -> Mapping[str, str]: ...
    @property
    def status(self) -> int | None: ...
    @property
    def answered(self) -> float | None: ...


class Served(Protocol):
    """A metadata server as the watchers see it: the simulator itself or a front."""

    @property
    def gce_url(self) -> str: ...
    @property
    def azure_url(self) -> str: ...
    @property
    def requests(self) -> Sequence[Answer]: ...


@dataclass
class FrontRecord:
    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    status: int | None = None
    #: `time.monotonic()` right before the front writes the head; None while it hangs.
    answered: float | None = None


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients and the simulator go away while connections hang: expected, not news."""


class _Quiet(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a metadata server or a receiver does

    def log_message(self, format: str, *args: Any) -> None:
        """No access log: it would cost the server CPU the benchmark does not ask for."""


class _Forward(_Quiet):
    server: _FrontServer

    def setup(self) -> None:
        super().setup()
        host, port = self.server.upstream
        # One upstream connection per client connection: long polls hang side by side.
        self.upstream = http.client.HTTPConnection(host, port)

    def finish(self) -> None:
        self.upstream.close()
        super().finish()

    def do_GET(self) -> None:
        self.forward()

    def do_POST(self) -> None:
        self.forward()

    def forward(self) -> None:
        parts = urlsplit(self.path)
        record = FrontRecord(self.command, parts.path, dict(parse_qsl(parts.query)))
        self.server.records.append(record)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        self.upstream.request(self.command, self.path, body=body, headers=headers)
        answer = self.upstream.getresponse()
        content = answer.read()
        record.status = answer.status
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(content)))
        # Stamped once the head is built, right before it is sent: building it is the
        # server's own time (in the driver's process, whose other threads and event loop it
        # waits for: 0.1 to 0.5 ms on a busy 2-core VM), not the watcher's part.
        record.answered = time.monotonic()
        self.end_headers()  # the head: one send
        self.wfile.write(content)  # the body: another


class _FrontServer(_QuietServer):
    block_on_close = False  # a handler may hang in a long poll until its client goes

    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        self.upstream = upstream
        self.records: list[FrontRecord] = []


class PlainFront:
    """`http.server` in front of `simulator` (see the module docstring); `async with`."""

    def __init__(self, simulator: Simulator) -> None:
        self._simulator = simulator
        self._server = _FrontServer((simulator.host, simulator.port))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _here(self, url: str) -> str:
        """The simulator's `url`, pointing at this front instead."""
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}{url.removeprefix(self._simulator.base_url)}"

    @property
    def gce_url(self) -> str:
        return self._here(self._simulator.gce_url)

    @property
    def azure_url(self) -> str:
        return self._here(self._simulator.azure_url)

    @property
    def requests(self) -> list[FrontRecord]:
        return self._server.records

    async def __aenter__(self) -> PlainFront:
        self._thread.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self._server.shutdown)
        self._server.server_close()


# -- the plain webhook receiver (its own process) -----------------------------------------------


class _Receive(_Quiet):
    server: _ReceiverServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        stamp = time.monotonic()
        name = self.path.removeprefix("/hook/")
        got = records_of(name, body, stamp)
        with self.server.arrived:
            self.server.records[name].extend(got)
            self.server.arrived.notify_all()
        if not name.startswith(ANSWERED):
            self.send_response(204)
            self.end_headers()
            return
        # `http.server` as it comes: HTTP/1.0, one answer per connection.
        self.protocol_version = "HTTP/1.0"
        self.close_connection = True
        answer = b'{"accepted":%d}' % len(got)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()  # the head: one send
        self.wfile.write(answer)  # the body: another

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = dict(parse_qsl(parts.query))
        kind, _, name = parts.path.strip("/").partition("/")
        records = self.server.records[name]
        if kind == "wait":
            count, timeout = int(query.get("count", "1")), float(query.get("timeout", "10"))
            with self.server.arrived:
                self.server.arrived.wait_for(lambda: len(records) >= count, timeout)
            answer: object = {"count": len(records)}
        else:
            answer = records
        body = json.dumps(answer).encode()
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
        self.wfile.write(head.encode() + b"\r\n\r\n" + body)  # the driver's answers: one write


class _ReceiverServer(_QuietServer):
    def __init__(self, port: int) -> None:
        super().__init__(("127.0.0.1", port), _Receive)
        self.records: defaultdict[str, list[Record]] = defaultdict(list)
        self.arrived = threading.Condition()


def main() -> None:
    _ReceiverServer(int(sys.argv[1])).serve_forever()


if __name__ == "__main__":
    main()
