"""`python -m bench.fleet_check [--events N] [--rounds R]`: the fleet service's CPU per event
spent turning received bytes into checked, typed events, apart from the store.

Issue 33's batch targets (20,000 events/s over HTTP, 10,000 from each bus, on 2 cores shared
with the senders) leave about 40 us of fleet CPU per event, all in; this measures the part
that is the same on every ingest path, in this process alone, so that a shared machine's
load does not move it (CPU time, `time.process_time`, not wall rates):

- **split**: an HTTP batch body of 100 events into its elements (`bounds.split_batch`);
- **classify**: each body checked against the contract and the fleet's bounds into an
  `Accepted` (`bridge.fleet.sources.base.classify`), in batches of 100;
- **commit**: `Ingestor.commit`'s own work per event (the `Batch`, the stats, the tracing
  hook, untraced as a fleet without `[fleet.tracing]` runs), with a store that keeps
  nothing (`NullStore`), so that the store's writing (bench.fleet_ingest measures it) is
  left out;
- **screen**: the identity screen of a request's events under `identity = "required"`
  (the credential cached, as every post after a sidecar's first has it), per event.

The events are `bench.fleet_workload`'s fleet: heartbeats of the three clouds and their
maintenance transitions (scheduled, started, completed), as the sidecar writes them. Each
part runs `--rounds` times over the same events and reports its leanest round, in
microseconds per event.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from collections.abc import Callable, Sequence
from typing import Final

from bench.fleet_workload import Workload
from bridge.fleet import bounds
from bridge.fleet.metrics import IngestStats
from bridge.fleet.sources.base import Ingestor, classify
from bridge.fleet.store import Accepted, Batch, IngestResult, Refused

BATCH: Final = 100
#: What `classify` returns for one batch.
Classified = tuple[list[Accepted], list[tuple[int, Refused]]]


class NullStore:
    """A store that keeps nothing and answers each batch as all new (what `Ingestor.commit`
    needs of a store, and no more: the store's own cost is not measured here)."""

    async def ingest(self, batch: Batch) -> IngestResult:
        lags = tuple(batch.received_at - a.event.time.timestamp() for a in batch.accepted)
        return IngestResult(len(batch.accepted), 0, len(batch.refused), lags)


def leanest(rounds: int, work: Callable[[], object]) -> float:
    """The least CPU seconds `work` took over `rounds` runs (the collector off, as a
    service's steady state between collections)."""
    best = float("inf")
    for _ in range(rounds):
        gc.collect()
        gc.disable()
        try:
            start = time.process_time()
            work()
            best = min(best, time.process_time() - start)
        finally:
            gc.enable()
    return best


def bodies(events: int) -> list[bytes]:
    """`events` bodies of a fleet of a tenth as many VMs: every kind of event the fleet
    receives in steady state (transitions first, then heartbeats round the fleet)."""
    return list(Workload(instances=max(30, events // 10), events=events).history())


def measure(events: Sequence[bytes], rounds: int) -> dict[str, float]:
    """Microseconds per event of each part (see the module docstring)."""
    batches = [list(events[i : i + BATCH]) for i in range(0, len(events), BATCH)]
    posted = [b"[" + b",".join(batch) + b"]" for batch in batches]
    count = len(events)
    figures: dict[str, float] = {}

    def split() -> None:
        for body in posted:
            bounds.split_batch(body)

    figures["split"] = leanest(rounds, split)
    classified = [classify(batch) for batch in batches]
    assert all(not refused for _, refused in classified), "the workload must be valid"

    def check() -> None:
        for batch in batches:
            classify(batch)

    figures["classify"] = leanest(rounds, check)
    ingestor = Ingestor(NullStore(), IngestStats())  # type: ignore[arg-type]

    async def commits() -> None:
        for accepted, _ in classified:
            await ingestor.commit("http", accepted)

    figures["commit"] = leanest(rounds, lambda: asyncio.run(commits()))
    figures["screen"] = leanest(rounds, _screening(classified))
    return {name: seconds / count * 1e6 for name, seconds in figures.items()}


def _screening(classified: list[Classified]) -> Callable[[], None]:
    """The identity screen of each VM's events with that VM's (cached) credential."""
    from bridge.fleet.identity.credential import Credentials
    from bridge.fleet.identity.gate import IdentityGate
    from bridge.fleet.identity.model import Attested
    from bridge.fleet.identity.screen import screen

    credentials = Credentials(b"k" * 32, "fleet", ttl=3600.0)
    gate = IdentityGate("required", credentials, "http")
    posts = []
    for accepted, _ in classified:
        for item in accepted:
            event = item.event
            instance = event.instance
            attested = Attested(
                provider=event.provider or "gce",
                method="gce_iit",
                id=instance.id,
                project=instance.project,
                subscription=instance.subscription,
                account=instance.account,
                source=event.source,
            )
            posts.append((credentials.issue(attested).token, [item]))

    def work() -> None:
        for token, events in posts:
            screen(gate, token, events, [])

    return work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_check", description=__doc__)
    parser.add_argument("--events", type=int, default=20_000, help="events (default 20,000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, the leanest kept")
    args = parser.parse_args(argv)
    events = bodies(args.events)
    figures = measure(events, args.rounds)
    beats = sum(b'"io.maintenancebridge.agent.heartbeat"' in body for body in events)
    print(
        f"{len(events)} events ({beats} heartbeats, {len(events) - beats} maintenance "
        f"transitions), leanest of {args.rounds} rounds, CPU us per event:"
    )
    for name, value in figures.items():
        print(f"  {name:<9} {value:7.2f}")
    print(f"  {'total':<9} {figures['split'] + figures['classify'] + figures['commit']:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
