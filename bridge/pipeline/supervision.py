"""The watchers as the runner supervises them, and what the surface may know of that.

The runner writes here (which watcher runs, the VM it identified, the notices it committed,
its crashes); this component exports its own figures (the notice counter, the metadata
requests) and health lines (is each watch task running, did the metadata service answer,
is a watcher crash-looping). The surface reads them through `bridge.infra.observe`'s
interfaces and never through the runner.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from bridge.infra.observe import Check
from bridge.infra.prometheus import PREFIX, Exposition
from bridge.pipeline.model import Instance, Notice
from bridge.pipeline.watchers.base import Watcher

if TYPE_CHECKING:
    from bridge.pipeline.watchers.http import RequestStats

#: How long a watcher that failed stays "not ready" after its last failure (longer than the
#: longest pause between two restarts, so a crash loop never looks ready in between).
CRASH_MEMORY: Final = 120.0


@dataclass(frozen=True, slots=True)
class WatcherCrash:
    """How often a watcher has failed since it last committed an update, and the last error."""

    count: int
    error: str
    at: float

    @classmethod
    def after(cls, previous: WatcherCrash | None, exc: Exception) -> WatcherCrash:
        count = previous.count + 1 if previous else 1
        return cls(count, f"{type(exc).__name__}: {exc}"[:300], time.time())


class Supervision:
    """The supervised watchers of the providers `names` (see the module docstring)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = sorted(names)
        #: The current watcher per provider (rebuilt after a crash).
        self.watchers: dict[str, Watcher] = {}
        #: The VM's identity per watcher, once it has identified it (what heartbeats carry).
        self.instances: dict[str, Instance] = {}
        #: The task running each watcher (it restarts the watcher itself after failures).
        self.tasks: dict[str, asyncio.Task[None]] = {}
        #: Notices seen since start, by (provider, kind, status): the metrics' counter.
        self.notice_counts: Counter[tuple[str, str, str]] = Counter()
        #: Watchers that failed and were restarted, by name (readiness reports a crash loop).
        self.crashes: dict[str, WatcherCrash] = {}

    # -- written by the runner ----------------------------------------------------------------

    def crashed(self, name: str, exc: Exception) -> None:
        self.crashes[name] = WatcherCrash.after(self.crashes.get(name), exc)

    def committed(self, name: str, notices: Iterable[Notice]) -> None:
        """The watcher's update is on disk: count its notices, forget its crashes."""
        for notice in notices:
            self.notice_counts[(notice.provider.value, notice.kind.value, notice.status.value)] += 1
        self.crashes.pop(name, None)

    @property
    def notices_seen(self) -> int:
        return sum(self.notice_counts.values())

    # -- read by the surface ------------------------------------------------------------------

    def export(self, out: Exposition) -> None:
        """The notice counter and each watcher's metadata figures for `/metrics`."""
        out.add(
            PREFIX + "notices_total",
            "counter",
            "Notices seen (each is one CloudEvent), by provider, kind and status.",
            [
                ({"provider": p, "kind": k, "status": s}, n)
                for (p, k, s), n in sorted(self.notice_counts.items())
            ],
        )
        watchers = {name: self.watchers[name] for name in self.names if name in self.watchers}
        out.add(
            PREFIX + "metadata_requests_total",
            "counter",
            "Requests made to the metadata service, answered or not.",
            [({"provider": name}, w.stats.requests) for name, w in watchers.items()],
        )
        out.add(
            PREFIX + "metadata_errors_total",
            "counter",
            "Failed metadata requests by cause: an HTTP status, timeout, connection, redirect, "
            "missing-vendor-header or malformed.",
            [
                ({"provider": name, "cause": cause}, count)
                for name, w in watchers.items()
                for cause, count in sorted(w.stats.errors.items())
            ],
        )
        out.add(
            PREFIX + "metadata_skipped_total",
            "counter",
            "Events or fields of metadata documents that could not be read and were left out.",
            [({"provider": name}, w.stats.skipped) for name, w in watchers.items()],
        )
        out.add(
            PREFIX + "metadata_up",
            "gauge",
            "1 when the last metadata request succeeded.",
            [({"provider": name}, 1 if w.healthy else 0) for name, w in watchers.items()],
        )
        out.add(
            PREFIX + "metadata_last_success_timestamp_seconds",
            "gauge",
            "When the metadata service last answered usefully (Unix time).",
            [
                ({"provider": name}, w.stats.last_success)
                for name, w in watchers.items()
                if w.stats.last_success is not None
            ],
        )
        out.add_histogram(
            PREFIX + "metadata_request_duration_seconds",
            "Duration of metadata requests, long polls included (GCE waits up to its timeout).",
            [({"provider": name}, w.stats.durations) for name, w in watchers.items()],
        )

    def liveness(self) -> list[Check]:
        """Every watch task is running (a metadata outage is not a liveness failure: the
        watcher is rebuilt from its checkpoint, and a restart of the process would not help)."""
        checks = []
        for name, task in sorted(self.tasks.items()):
            alive = not task.done()
            checks.append(Check(f"watcher:{name}", alive, "watching" if alive else "stopped"))
        return checks

    def readiness(self) -> list[Check]:
        """Per watcher: its last metadata request (and each part's) succeeded, and it is not
        crash-looping."""
        checks: list[Check] = []
        now = time.time()
        for name in self.names:
            watcher = self.watchers.get(name)
            if watcher is None:
                checks.append(Check(f"metadata:{name}", False, "not started"))
                continue
            checks.append(_metadata_check(f"metadata:{name}", watcher.stats, watcher.healthy))
            for part, stats in sorted(watcher.parts.items()):
                ok = stats.consecutive_failures == 0
                checks.append(_metadata_check(f"metadata:{name}:{part}", stats, ok))
            crash = self.crashes.get(name)
            if crash is not None and now - crash.at < CRASH_MEMORY:
                checks.append(
                    Check(
                        f"watcher:{name}",
                        False,
                        f"failed {crash.count} time(s), last {now - crash.at:.0f}s ago: "
                        f"{crash.error}",
                    )
                )
        return checks


def _metadata_check(name: str, stats: RequestStats, healthy: bool) -> Check:
    """One readiness line for a metadata client, or one part of it (a GCE key)."""
    if healthy and stats.last_success is not None:
        age = time.time() - stats.last_success
        return Check(name, True, f"last answer {age:.0f}s ago")
    if stats.last_success is None and stats.consecutive_failures == 0:
        return Check(name, False, "waiting for the first answer")
    causes = ", ".join(f"{cause} x{n}" for cause, n in sorted(stats.errors.items()))
    return Check(name, False, f"{stats.consecutive_failures} failed request(s) in a row ({causes})")
