"""`maintenance-bridge demo --fleet`: a small fleet on one machine, no cloud account.

Plays simulated VMs through real bridges into a real fleet service over HTTP:

- `web-1` (GCE, us-central1-a) on the `demo` scenario: upcoming maintenance, a live
  migration;
- `web-2` (GCE, europe-west1-b) on `gce-spot-preemption`;
- `db-1`, `db-2`, `db-3` (Azure, one availability set in `demo-rg`) sharing Scheduled
  Events as VMs of one group do: the `demo` scenario's Freeze and user Reboot of `db-1`,
  and a Redeploy of `db-2` and `db-3` an hour away.

Each VM has its own bridge (watcher, SQLite spool, dispatcher) whose webhook sink posts
signed batches to the fleet service's `POST /v1/events`, with heartbeats every 10 s. The
demo prints the URLs to look at while it plays, and the fleet summary when the scenarios are
over. The fleet requires instance identity: each bridge first enrolls with its VM's identity
document, signed by the simulators' keys, whose trust material the fleet is configured with
(docs/security.md "Identity"). When the scenarios are over it keeps serving (the bridges keep
sending heartbeats, so the page stays live) until Ctrl-C, which ends it cleanly with "stopped";
`--no-keep` ends it with the scenarios instead (scripts, tests). The store lives in a
temporary directory, deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

from bridge.app.fleet import print_status
from bridge.app.signals import stop_on_signals
from bridge.config import parse_config
from bridge.fleet.config import parse_fleet_config
from bridge.fleet.service import FleetService

log = logging.getLogger("bridge.app.fleet_demo")

AZURE_GROUP = ("db-1", "db-2", "db-3")
HEARTBEAT_INTERVAL = 10.0
AUDIENCE = "maintenance-bridge-demo-fleet"


def identity_table(root: Path, signer: Any) -> dict[str, str]:
    """`[fleet.identity]` trusting the simulators' `signer`, its trust material written to
    files in `root` as an operator would (the demo; tests of a fleet with identity)."""
    material = signer.trust()
    (root / "jwks.json").write_text(json.dumps(material["jwks"]))
    (root / "ca.pem").write_text(material["ca_pem"])
    return {
        "audience": AUDIENCE,
        "credential_key": secrets.token_urlsafe(32),
        "gce_jwks": str(root / "jwks.json"),
        "azure_jwks": str(root / "jwks.json"),
        "azure_ca": str(root / "ca.pem"),
        "azure_signer_name": material["signer_name"],
    }


def vm_bridge(
    provider: Literal["gce", "azure"],
    source: dict[str, Any],
    state: Path,
    fleet_url: str,
    secret: str,
    *,
    enroll: bool = True,
) -> Any:
    """One simulated VM's bridge posting to the fleet; `enroll`: with instance identity (the
    demo's fleet requires it), off for a fleet without `[fleet.identity]`."""
    from bridge.compose import compose

    identity = {"enroll_url": f"{fleet_url}/v1/enroll", "audience": AUDIENCE} if enroll else None
    config = parse_config(
        {
            "source": {"provider": provider, provider: source},
            "state": {"dir": str(state)},
            "delivery": {"shutdown_timeout": 2.0, "retry_initial": 0.2, "retry_max": 2.0},
            "listener": {"enabled": False},
            "heartbeat": {"interval": HEARTBEAT_INTERVAL},
            **({"identity": identity} if identity else {}),
            "sinks": [
                {
                    "type": "webhook",
                    "name": "fleet",
                    "url": f"{fleet_url}/v1/events",
                    "mode": "batch",
                    "signing": "standard",
                    "secrets": [secret],
                }
            ],
        }
    )
    return compose(config, [provider])


async def run_demo(args: argparse.Namespace) -> int:
    from bridge.providers.azure.simulated.group import AzureGroup
    from bridge.simulator import Simulator
    from bridge.simulator.attestation import Signer

    signer = Signer()  # both simulators sign with it: one set of trust material
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
    stop = asyncio.Event()
    stop_on_signals(stop)
    with tempfile.TemporaryDirectory(prefix="maintenance-bridge-fleet-demo-") as tmp:
        root = Path(tmp)
        fleet_config = parse_fleet_config(
            {
                "fleet": {
                    "listener": {"port": 0},
                    "store": {"url": f"sqlite://{root / 'fleet.sqlite3'}"},
                    "identity": identity_table(root, signer),
                    "sources": [{"type": "http", "secrets": [secret], "identity": "required"}],
                }
            }
        )
        service = FleetService(fleet_config)
        identity = {
            "gce": {"instance_name": "web-1"},
            "azure": {"name": "db-1", "resource_group_name": "demo-rg"},
        }
        spot_identity = {"gce": {"instance_name": "web-2", "zone": "europe-west1-b"}}
        async with (
            service.running(),
            Simulator("both", "demo", speed=args.speed, identity=identity) as main_sim,
            Simulator(
                "gce", "gce-spot-preemption", speed=args.speed, identity=spot_identity
            ) as spot_sim,
            AzureGroup(main_sim, AZURE_GROUP) as group,
        ):
            main_sim.signer = spot_sim.signer = signer

            def bridge(provider: Literal["gce", "azure"], source: dict[str, Any], name: str) -> Any:
                return vm_bridge(provider, source, root / name, service.url, secret)

            bridges = [
                bridge("gce", {"metadata_url": main_sim.gce_url}, "web-1"),
                bridge("gce", {"metadata_url": spot_sim.gce_url}, "web-2"),
                *(
                    bridge("azure", {"imds_url": group.imds_url(n), "poll_interval": 1.0}, n)
                    for n in AZURE_GROUP
                ),
            ]
            # A redeploy of two VMs of the group, an hour away: see /v1/fleet/upcoming.
            main_sim.azure.add_event(
                event_type="Redeploy", resources=list(AZURE_GROUP[1:]), not_before_in=3600
            )
            url = service.url
            print(
                f"fleet service at {url}: 5 VMs (2 GCE, 3 Azure in one group) report to it\n"
                f"  open {url}/ in a browser: the fleet dashboard\n"
                f"  curl {url}/v1/fleet/summary\n"
                f"  curl {url}/v1/fleet/notices\n"
                f"  curl {url}/v1/fleet/upcoming?within=24h\n"
                f"  curl '{url}/v1/fleet/eligible?instance=web-1&instance=db-1&instance=web-2'\n"
                f"  curl {url}/v1/fleet/instances\n"
                f"  curl {url}/v1/fleet/events\n"
                f"  curl {url}/metrics\n"
                "(Ctrl-C to stop)",
                file=sys.stderr,
                flush=True,
            )
            stops = [asyncio.Event() for _ in bridges]
            tasks = [asyncio.create_task(b.run(s)) for b, s in zip(bridges, stops, strict=True)]
            while not stop.is_set() and (main_sim.pending_steps or spot_sim.pending_steps):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
            if not stop.is_set():
                # Let the last notices be delivered (or Ctrl-C, which ends the wait).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 3.0)
            if not stop.is_set():
                print("\nscenario over; the fleet saw:", file=sys.stderr)
                await print_status(service.store, sys.stdout)
                if _keeps_serving(args):
                    print(
                        f"\nthe fleet service keeps serving at {url}/ (the VMs keep reporting); "
                        "Ctrl-C to stop",
                        file=sys.stderr,
                        flush=True,
                    )
                    await stop.wait()
                    print("stopped", file=sys.stderr)
            else:
                print("\nstopped; the fleet saw:", file=sys.stderr)
                await print_status(service.store, sys.stdout)
            for event in stops:
                event.set()
            await asyncio.gather(*tasks, return_exceptions=True)
    return 0


def _keeps_serving(args: argparse.Namespace) -> bool:
    """`--keep` (the command line's default) or `--no-keep`; a caller that builds its own
    arguments without the flag (a script) gets the scenarios' end, not a wait for Ctrl-C."""
    return bool(getattr(args, "keep", False))
