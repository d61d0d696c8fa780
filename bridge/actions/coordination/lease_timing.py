"""The time limits of a lease holder (`elect`'s leader, a budget slot's holder), in one place
so that both follow the same rules (docs/coordination.md, "Time limits")."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Timing:
    """Every time limit of a lease holder, derived from the lease's TTL (seconds), so that
    the holder stops counting on its lease (and `elect` has its command gone) before the
    lease can expire at etcd.

    etcd counts a lease's TTL from when it *received* the last renewal, which is after we
    *sent* it; so `sent + ttl` is the earliest the lease can expire, on any clock that runs
    at the rate of etcd's. From the time the last successful renewal was sent:

    - `renew_every` (ttl/3): the next renewal; a failed one is tried again after
      `retry_pause` (ttl/12), each within `request_timeout` (ttl/6, at most the configured
      `request_timeout`) and never past the deadline, so about three attempts fit.
    - `deadline` (ttl - margin, margin = ttl/4): no renewal succeeded by then, the lease is
      taken as lost whatever etcd says later: `elect`'s command gets SIGTERM..., a budget
      slot is reported as no longer held (budget.py)
    - `kill_by` (ttl - margin/2): ...and SIGKILL if it still runs (its grace is `--grace`
      or what is left until then, whichever is shorter), ttl/8 before the earliest expiry.

    Every request made while leading (renew, resign, revoke) or renewing a slot uses
    `request_timeout`. `elect`'s campaign is the exception: it waits, unbounded, to be
    elected.

    The margin covers what the clocks cannot: the time between reading the clock and the
    renewal leaving, and a slow scheduler. It does not cover a process paused (SIGSTOP, a
    VM frozen by live migration, a long GC) for longer than the margin: such a process
    learns of its deadline only when it runs again, maybe after the lease expired; that is
    what the fencing token is for (docs/coordination.md).
    """

    ttl: float
    configured_timeout: float = 5.0

    @property
    def margin(self) -> float:
        return self.ttl / 4

    @property
    def renew_every(self) -> float:
        return self.ttl / 3

    @property
    def retry_pause(self) -> float:
        return self.ttl / 12

    @property
    def request_timeout(self) -> float:
        return min(self.ttl / 6, self.configured_timeout)

    def deadline(self, sent: float) -> float:
        return sent + self.ttl - self.margin

    def kill_by(self, sent: float) -> float:
        return sent + self.ttl - self.margin / 2
