"""The spool's health lines for `/healthz` and `/readyz`, from its own read and write state.

For readiness any failing read or write fails the line; for liveness only a failure older
than the tolerance does (a full disk that an operator is freeing is not yet a reason to
restart; a spool that stays broken is).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bridge.infra.observe import Check
from bridge.pipeline.spool import Spool


def spool_check(spool: Spool, tolerance: float | None) -> Check:
    """The spool line; `tolerance` None: any failure fails it, else only an older one."""
    now = time.time()
    for kind, health in (("writes", spool.writes), ("reads", spool.reads)):
        if health.failing_since is None:
            continue
        since = now - health.failing_since
        if tolerance is None or since > tolerance:
            return Check("spool", False, f"{kind} failing for {since:.0f}s: {health.last_error}")
    return Check("spool", True, str(spool.path))


@dataclass(frozen=True, slots=True)
class SpoolChecks:
    """The spool as a health source; `tolerance` is `delivery.spool_failure_timeout`."""

    spool: Spool
    tolerance: float

    def liveness(self) -> list[Check]:
        return [spool_check(self.spool, self.tolerance)]

    def readiness(self) -> list[Check]:
        return [spool_check(self.spool, None)]
