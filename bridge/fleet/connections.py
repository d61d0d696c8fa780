"""The fleet listener's connections, bounded: slow clients cannot starve health and sidecars.

Each connection holds a file descriptor. With the default soft limit of 1,024, about 1,100
clients that open a connection and send their headers a byte at a time (or never) made
`accept` fail and `/healthz` unreachable. Three bounds, as the OpenTelemetry collector,
nginx and the CIS benchmarks advise:

- `raise_file_limit`: at start, the soft RLIMIT_NOFILE goes up to the hard limit (where the
  platform has one and allows it).
- `ConnectionGuard`: a client must send its first request's headers within
  `HEADER_TIMEOUT` seconds, or the connection is closed.
- At most `max_connections` (the file limit less a reserve for the store, the sources and
  the logs) are open; a new connection past that closes the oldest one still waiting for its
  headers (a slow client), or, when every connection is busy with a request, is itself
  closed at once. So a health probe or a sidecar is served even among a thousand slow ones.

The guard wraps aiohttp's protocol factory (`web.Server`) and forwards every protocol call
to the real handler; it only reads the first bytes of a connection to see its headers end.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any, Final

from bridge.infra.platform import limits

log = logging.getLogger("bridge.fleet.connections")

HEADER_TIMEOUT: Final = 10.0
#: File descriptors kept for everything else the service opens (store, sources, logs).
RESERVED_FILES: Final = 128
#: Connections at most, whatever the file limit.
MAX_CONNECTIONS: Final = 10_000
_END_OF_HEADERS: Final = b"\r\n\r\n"


def raise_file_limit() -> int:
    """Raise the soft open-file limit to the hard one where allowed; the soft limit now."""
    soft, problem = limits.raise_file_limit(MAX_CONNECTIONS + RESERVED_FILES)
    if problem is not None:
        log.warning("%s", problem)
    return soft


def connection_cap(file_limit: int) -> int:
    """Connections the listener keeps open at most, under `file_limit` descriptors."""
    return max(16, min(MAX_CONNECTIONS, file_limit - RESERVED_FILES))


class _Guarded(asyncio.Protocol):
    """One connection: forwards to aiohttp's handler, watches for the end of the headers."""

    def __init__(self, guard: ConnectionGuard, inner: Any) -> None:
        self._guard = guard
        self._inner = inner
        self._tail = b""
        self.waiting = True  # for its first request's headers
        self.admitted = False
        self.transport: asyncio.BaseTransport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if not self._guard.admit(self):
            transport.close()
            return
        self.admitted = True
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._guard.header_timeout, self._too_slow)
        self._inner.connection_made(transport)

    def _too_slow(self) -> None:
        if self.waiting and self.transport is not None:
            self._guard.timed_out += 1
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.waiting:
            seen = self._tail + data
            if _END_OF_HEADERS in seen:
                self._started()
            else:
                self._tail = seen[-3:]
        self._inner.data_received(data)

    def _started(self) -> None:
        self.waiting = False
        self._guard.started(self)
        if self._timer is not None:
            self._timer.cancel()

    def eof_received(self) -> bool | None:
        result: bool | None = self._inner.eof_received()
        return result

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._guard.release(self)
        if self.admitted:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class ConnectionGuard:
    """A protocol factory for the listener around aiohttp's (see the module docstring);
    every other attribute is the wrapped `web.Server`'s (the runner shuts it down)."""

    def __init__(
        self, server: Any, max_connections: int, header_timeout: float | None = None
    ) -> None:
        self._server = server
        self.max_connections = max_connections
        self.header_timeout = HEADER_TIMEOUT if header_timeout is None else header_timeout
        self._waiting: OrderedDict[int, _Guarded] = OrderedDict()
        self._busy: set[int] = set()
        self.timed_out = 0
        self.evicted = 0
        self.refused = 0

    def __call__(self) -> _Guarded:
        return _Guarded(self, self._server())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)

    def admit(self, connection: _Guarded) -> bool:
        if len(self._waiting) + len(self._busy) >= self.max_connections:
            if not self._waiting:
                self.refused += 1
                return False
            _, oldest = self._waiting.popitem(last=False)
            self.evicted += 1
            if oldest.transport is not None:
                oldest.transport.close()
        self._waiting[id(connection)] = connection
        return True

    def started(self, connection: _Guarded) -> None:
        if self._waiting.pop(id(connection), None) is not None:
            self._busy.add(id(connection))

    def release(self, connection: _Guarded) -> None:
        self._busy.discard(id(connection))
        self._waiting.pop(id(connection), None)
