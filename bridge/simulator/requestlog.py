"""Log of vendor-endpoint requests the simulator saw, so tests can assert how a client polls
(e.g. that a long-polling client does not busy-loop)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

MAX_RECORDS = 10_000


@dataclass
class RequestRecord:
    seq: int
    time: float
    """Wall-clock epoch seconds when the request arrived."""
    sim_time: float
    provider: str
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    client: str
    status: int | None = None
    """Final status; None while in flight (hanging), 0 when the connection was dropped."""
    fault: str | None = None
    duration: float | None = field(default=None)
    received: float = 0.0
    """`time.monotonic()` when the request arrived (system-wide on Linux: benchmarks compare
    it with other processes' clocks)."""
    answered: float | None = None
    """`time.monotonic()` when the answer was handed to the server to write; None until then."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class RequestLog:
    def __init__(self) -> None:
        self._records: deque[RequestRecord] = deque(maxlen=MAX_RECORDS)
        self._seq = 0

    def add(
        self,
        *,
        sim_time: float,
        provider: str,
        method: str,
        path: str,
        query: dict[str, str],
        headers: dict[str, str],
        client: str,
    ) -> RequestRecord:
        self._seq += 1
        record = RequestRecord(
            self._seq, time.time(), sim_time, provider, method, path, query, headers, client
        )
        record.received = time.monotonic()
        self._records.append(record)
        return record

    def all(self) -> list[RequestRecord]:
        return list(self._records)

    def since(self, seq: int) -> list[RequestRecord]:
        return [r for r in self._records if r.seq > seq]

    def clear(self) -> None:
        self._records.clear()
