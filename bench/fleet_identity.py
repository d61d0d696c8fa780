"""The fleet benchmark's identity arm (#34: "ingest with identity required stays within 10 %
of the rate without it"): the same signed batches ingested by a fleet with
`identity = "off"` and by one with `identity = "required"`, side by side in one run.

A sidecar posts only its own events, and under `required` every event of a post must be
about the instance whose credential the post carries: so both arms post the fleet's events
grouped by VM (at most a webhook batch each), in the same order, from the same senders,
each into a new fleet service process with a fresh SQLite store. Under `required` each VM
first enrolls as its sidecar does: the simulator (bench process, loopback) serves that VM's
signed identity document (GCE's identity token, Azure's managed-identity token), the fleet
verifies it at `POST /v1/enroll` and issues the credential; the enrollments are not timed,
only the posts that follow. The arms alternate over `ROUNDS` rounds and each reports its
best round (a shared host's noise only ever slows a round down).

`python -m bench.fleet` runs it after its own parts; `python -m bench.fleet_identity
--instances 10000` runs only this arm at a chosen size (and prints the two rates), to
measure or profile it without the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, NamedTuple

import psutil

from bench.procs import to_toml
from bridge.app.fleet_demo import AUDIENCE, identity_table
from bridge.config import parse_config
from bridge.infra.credential import HEADER, IdentitySettings
from bridge.pipeline.enrollment import Enrollment
from bridge.pipeline.model import Instance, Provider
from bridge.simulator import Simulator
from sinks.webhook import BATCH_SIZE

#: Rounds per arm, alternating; each arm reports its best.
ROUNDS: Final = 3
#: The ratio the issue asks for: required's rate at least 90 % of off's.
TARGET_RATIO: Final = 0.9


class Arms(NamedTuple):
    """Events per second of each arm's best round; the posts of a round (the events
    grouped by VM) and the VMs enrolled before the `required` ones; and the fleet service's
    CPU time per 1,000 events of each arm's leanest round (ms), which a shared host's load
    barely moves: what identity costs the service itself, where the rates also carry the
    disk's and the neighbours' noise."""

    off: float
    required: float
    posts: int
    enrolled: int
    off_cpu: float = 0.0
    required_cpu: float = 0.0
    rounds: int = ROUNDS

    @property
    def ratio(self) -> float:
        return self.required / self.off if self.off else 0.0

    @property
    def cpu_ratio(self) -> float:
        """The service's CPU per event, required over off (1.0: identity costs nothing)."""
        return self.required_cpu / self.off_cpu if self.off_cpu else 0.0


def service_of(folder: Path) -> psutil.Process | None:
    """The fleet service process this benchmark started for `folder` (its configuration
    lives there), None if it cannot be told."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any(str(folder) in part for part in child.cmdline()):
                return child
    return None


def cpu_seconds(process: psutil.Process | None) -> float:
    if process is None:
        return 0.0
    with contextlib.suppress(psutil.Error):
        times = process.cpu_times()
        return float(times.user + times.system)
    return 0.0


def by_instance(bodies: list[bytes]) -> list[tuple[str, list[bytes]]]:
    """The events grouped by their source (a VM's sidecar), each group cut into webhook
    batches, in the order each VM's first event came."""
    groups: dict[str, list[bytes]] = {}
    for body in bodies:
        groups.setdefault(json.loads(body)["source"], []).append(body)
    return [
        (source, events[i : i + BATCH_SIZE])
        for source, events in groups.items()
        for i in range(0, len(events), BATCH_SIZE)
    ]


def serve_identity(sim: Simulator, vm: Instance) -> str:
    """Make the simulator serve `vm`'s identity (one VM at a time); its provider's name."""
    if vm.provider is Provider.GCE:
        names = {
            "project_id": vm.project,
            "zone": vm.zone,
            "instance_name": vm.name,
            "instance_id": int(vm.id),
        }
    else:
        names = {
            "name": vm.name,
            "vm_id": vm.id,
            "subscription_id": vm.subscription,
            "resource_group_name": vm.resource_group,
        }
    part = vm.provider.value
    sim.identity = sim.identity.replace(part, replace(getattr(sim.identity, part), **names))
    return part


async def enroll(sim: Simulator, url: str, vms: list[Instance]) -> dict[str, str]:
    """Each VM enrolled at the fleet `url` by the sidecar's own code
    (`bridge.pipeline.enrollment`: its cloud's document read from the simulator, posted to
    `POST /v1/enroll`): its credential by source."""
    configs = {
        "gce": parse_config({"source": {"provider": "gce", "gce": {"metadata_url": sim.gce_url}}}),
        "azure": parse_config(
            {"source": {"provider": "azure", "azure": {"imds_url": sim.azure_url}}}
        ),
    }
    settings = IdentitySettings(enroll_url=f"{url}/v1/enroll", audience=AUDIENCE)
    credentials: dict[str, str] = {}
    for vm in vms:
        part = serve_identity(sim, vm)
        sidecar = Enrollment(settings, configs[part])
        sidecar.identified(part, vm)
        credentials[vm.source] = await sidecar.credential()
    return credentials


#: `(workdir, extra fleet.toml, identity mode)` -> a running fleet service's URL (stopped on
#: the way out): `bench.fleet.fleet_at`.
Start = Callable[[Path, str, str], AbstractAsyncContextManager[str]]
#: `(url, [(events, extra headers)], events in all)` -> events/s: `bench.fleet.post_batches`.
PostAll = Callable[[str, list[tuple[list[bytes], dict[str, str]]], int], Awaitable[float]]


async def compare(
    bodies: list[bytes],
    vms: list[Instance],
    workdir: Path,
    start: Start,
    post_all: PostAll,
    rounds: int = ROUNDS,
) -> Arms:
    """Both arms, alternating over `rounds` rounds (off first, then required first, and so
    on: a drift of the host's load favours neither), each into a new fleet service."""
    batches = by_instance(bodies)
    best = {"off": 0.0, "required": 0.0}
    cpu = {"off": float("inf"), "required": float("inf")}
    async with Simulator(provider="both") as sim:
        sim.faults.set("azure", rate_limit=False)
        for round_ in range(rounds):
            for arm in ("off", "required") if round_ % 2 == 0 else ("required", "off"):
                folder = workdir / f"identity-{arm}-{round_}"
                folder.mkdir()
                # `[fleet.identity]` trusting the simulator's keys, as the demo's fleet does
                table = {"fleet.identity": identity_table(folder, sim.signer)}
                extra = to_toml(table) if arm == "required" else ""
                async with start(folder, extra, arm) as url:
                    credentials: dict[str, str] = {}
                    if arm == "required":
                        print(f"[bench.fleet] enrolling {len(vms)} VMs", file=sys.stderr)
                        credentials = await enroll(sim, url, vms)
                    posts = [
                        (events, {HEADER: credentials[source]} if credentials else {})
                        for source, events in batches
                    ]
                    print(f"[bench.fleet] identity {arm}, round {round_ + 1}", file=sys.stderr)
                    service = service_of(folder)
                    before = cpu_seconds(service)
                    rate = await post_all(url, posts, len(bodies))
                    per_thousand = (cpu_seconds(service) - before) * 1e6 / len(bodies)
                    print(
                        f"[bench.fleet] identity {arm}, round {round_ + 1}: {rate:,.0f} events/s,"
                        f" fleet CPU {per_thousand:,.0f} ms per 1,000 events",
                        file=sys.stderr,
                    )
                    best[arm] = max(best[arm], rate)
                    cpu[arm] = min(cpu[arm], per_thousand)
    return Arms(
        best["off"],
        best["required"],
        len(batches),
        len(vms),
        0.0 if cpu["off"] == float("inf") else cpu["off"],
        0.0 if cpu["required"] == float("inf") else cpu["required"],
        rounds,
    )


def section(arms: Arms) -> list[str]:
    """The "## Identity required vs off" section of the fleet report (`bench.fleet`)."""
    return [
        "",
        "## Identity required vs off",
        "",
        "The same signed batches, grouped by VM as each sidecar posts its own events "
        f"({arms.posts:,} posts of at most {BATCH_SIZE}), into a new fleet service with "
        '`identity = "off"` and one with `identity = "required"` whose '
        f"{arms.enrolled:,} sidecars enrolled first (not timed) and send their credential with "
        f"every post; best of {arms.rounds} alternating rounds each. The service's CPU time per "
        "1,000 events (its leanest round) is what identity costs the service itself; the "
        "rates also carry the disk's fsync and a shared host's load.",
        "",
        "| identity | events/s | fleet CPU ms per 1,000 events |",
        "| --- | --- | --- |",
        f"| off | {arms.off:,.0f} | {arms.off_cpu:,.0f} |",
        f"| required | {arms.required:,.0f} | {arms.required_cpu:,.0f} |",
        f"| required / off | {arms.ratio:.1%} | {arms.cpu_ratio:.1%} |",
    ]


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.fleet_identity [--instances N] [--events M] [--rounds R]`: only the
    identity arm, with the fleet benchmark's events and VMs (`bench.fleet`)."""
    from bench import fleet

    parser = argparse.ArgumentParser(
        prog="python -m bench.fleet_identity",
        description="Ingest with identity required vs off (the fleet benchmark's identity arm).",
    )
    parser.add_argument("--instances", type=int, default=fleet.FULL.instances)
    parser.add_argument("--events", type=int, help="default: 10 per instance")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="alternating, best of")
    args = parser.parse_args(argv)
    sizes = fleet.Sizes(args.instances, args.events or 10 * args.instances, 0)
    bodies = fleet.fleet_events(sizes, datetime.now(UTC))
    vms = [fleet._vm(index) for index in range(sizes.instances)]
    with tempfile.TemporaryDirectory(prefix="bench-fleet-identity-") as tmp:
        arms = asyncio.run(
            compare(bodies, vms, Path(tmp), fleet.fleet_at, fleet.post_batches, args.rounds)
        )
    verdict = "PASS" if arms.ratio >= TARGET_RATIO else "MISS"
    print(f"{sizes.instances:,} VMs, {len(bodies):,} events, {args.rounds} rounds")
    print("\n".join(section(arms)[1:]))
    print(f"\nrequired / off {arms.ratio:.1%}: {verdict} (target {TARGET_RATIO:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
