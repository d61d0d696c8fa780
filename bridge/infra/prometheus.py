"""Prometheus text exposition (format 0.0.4) of the bridge's own counters, built at scrape time.

The bridge already keeps every figure an operator needs (notices seen, per-sink delivery
stats, spool depth, metadata request errors and durations); a scrape reads them and renders
the text format. That keeps the hot path free of a metrics library and the start-up free of
its import, and there is exactly one place where each figure is counted. Tests check the
output with the reference parser (`prometheus_client.parser`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

Labels = Mapping[str, str]
MetricType = Literal["counter", "gauge", "histogram"]

#: Metadata request durations: short reads (ms) up to GCE long polls (the 60 s default).
REQUEST_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    10.0,
    30.0,
    60.0,
    120.0,
)

#: The prefix of every metric of the sidecar (the fleet service has its own).
PREFIX: Final = "maintenance_bridge_"


@dataclass
class Histogram:
    """Cumulative-bucket histogram, the shape Prometheus wants, cheap to observe."""

    buckets: tuple[float, ...] = REQUEST_BUCKETS
    counts: list[int] = field(init=False)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        self.total += value
        self.count += 1
        index = bisect.bisect_left(self.buckets, value)  # the first bound >= value, in C
        if index < len(self.counts) and value <= self.buckets[index]:  # not +Inf, not NaN
            self.counts[index] += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs including `+Inf`."""
        running = 0
        pairs = []
        for bound, count in zip(self.buckets, self.counts, strict=True):
            running += count
            pairs.append((_number(bound), running))
        pairs.append(("+Inf", self.count))
        return pairs


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items())
    return "{" + inner + "}"


class Exposition:
    """Accumulates metric families and renders the text format."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def _header(self, name: str, kind: MetricType, help_text: str) -> str:
        self._lines.append(f"# HELP {name} {help_text.replace(chr(10), ' ')}")
        self._lines.append(f"# TYPE {name} {kind}")
        return name

    def add(
        self,
        name: str,
        kind: Literal["counter", "gauge"],
        help_text: str,
        samples: Iterable[tuple[Labels, float]],
    ) -> None:
        """One family; counters get the `_total` suffix in their name already."""
        full = self._header(name, kind, help_text)
        for labels, value in samples:
            self._lines.append(f"{full}{_labels(labels)} {_number(value)}")

    def add_histogram(
        self, name: str, help_text: str, series: Iterable[tuple[Labels, Histogram]]
    ) -> None:
        full = self._header(name, "histogram", help_text)
        for labels, histogram in series:
            for le, count in histogram.cumulative():
                self._lines.append(f"{full}_bucket{_labels({**labels, 'le': le})} {count}")
            self._lines.append(f"{full}_sum{_labels(labels)} {_number(histogram.total)}")
            self._lines.append(f"{full}_count{_labels(labels)} {histogram.count}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"
