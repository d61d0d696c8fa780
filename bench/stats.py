"""Latency samples and their summaries (milliseconds)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class Summary:
    p50: float
    p99: float
    max: float
    count: int


def summarize(values: list[float]) -> Summary:
    if not values:
        return Summary(float("nan"), float("nan"), float("nan"), 0)
    ordered = sorted(values)
    if len(ordered) == 1:
        return Summary(ordered[0], ordered[0], ordered[0], 1)
    cuts = statistics.quantiles(ordered, n=100, method="inclusive")
    return Summary(cuts[49], cuts[98], ordered[-1], len(ordered))


@dataclass
class Series:
    """Notice-to-delivery latencies of one watcher: total, and the poll wait inside it.

    `total`: from the change in the simulator to the moment the consumer held the notice
    (our receiver got the event / the sample printed it). `wait`: from the change to the
    moment the simulator handed over the first answer carrying it. `ours` = total - wait:
    what the watcher itself adds (parse, diff, spool commit with fsync, dispatch, HTTP POST).
    """

    name: str
    baseline: bool
    total: list[float] = field(default_factory=list)
    wait: list[float] = field(default_factory=list)
    expected: int = 0

    def add(self, total_s: float, wait_s: float) -> None:
        self.total.append(total_s * 1000)
        self.wait.append(wait_s * 1000)

    @property
    def ours(self) -> list[float]:
        return [t - w for t, w in zip(self.total, self.wait, strict=True)]
