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
    what the watcher itself adds (parse, diff, spool commit, dispatch, HTTP POST).
    """

    name: str
    baseline: bool
    total: list[float] = field(default_factory=list)
    wait: list[float] = field(default_factory=list)
    expected: int = 0
    #: When the answer carrying each transition was handed over (monotonic seconds): equal
    #: moments mean one poll answer carried several transitions, delivered one after another.
    answered: list[float] = field(default_factory=list)

    def add(self, changed: float, answered: float, held: float) -> None:
        """One transition, from its three monotonic moments (seconds): the change, the
        first answer carrying it, and the consumer holding it."""
        self.total.append((held - changed) * 1000)
        self.wait.append((answered - changed) * 1000)
        self.answered.append(answered)

    @property
    def ours(self) -> list[float]:
        return [t - w for t, w in zip(self.total, self.wait, strict=True)]


def worst(series: Series, top: int = 5) -> list[str]:
    """The slowest transitions (our part) and what shared their poll answer with them."""
    ours = series.ours
    lines = [f"{series.name}: the {top} slowest transitions, our part (poll wait):"]
    for index in sorted(range(len(ours)), key=lambda i: -ours[i])[:top]:
        shared = sum(abs(other - series.answered[index]) < 1e-6 for other in series.answered)
        context = f"one of {shared} transitions in that answer" if shared > 1 else "alone"
        waited = series.wait[index]
        lines.append(f"  #{index:<4d} {ours[index]:7.2f} ms  (waited {waited:7.1f} ms; {context})")
    return lines
