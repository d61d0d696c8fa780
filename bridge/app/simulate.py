"""The simulator's program: ``maintenance-bridge simulate`` and ``python -m bridge.simulator``.

``add_arguments`` and ``run`` are separate so the main CLI can mount them as a subcommand;
``main`` is the standalone program with its own parser.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, TextIO

from bridge.simulator.part import choices

if TYPE_CHECKING:  # imported when serving: the main CLI mounts add_arguments at every start
    from bridge.simulator.server import Simulator

DEFAULT_PORT = 8181


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--provider",
        choices=choices(),
        default="both",
        help="which metadata service(s) to serve (default: both = GCE and Azure, on one port; "
        "all adds AWS)",
    )
    parser.add_argument(
        "--scenario", metavar="NAME|PATH", help="shipped scenario name or path to a TOML file"
    )
    parser.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="simulated seconds per real second (default 1.0: real vendor timings)",
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--list-scenarios", action="store_true", help="list shipped scenarios and exit"
    )


def _banner(sim: Simulator, out: TextIO) -> None:
    from bridge.simulator.part import parts

    scenario = sim.scenario.name if sim.scenario else "(none: drive it through /_sim/)"
    lines = [
        f"maintenance-bridge simulator: provider={sim.provider} scenario={scenario} "
        f"speed={sim.speed:g}",
        f"  control API : {sim.base_url}/_sim/state",
    ]
    for simulated in parts():
        if sim.serves(simulated.name):
            lines += simulated.banner(sim)
    lines.append("Press Ctrl-C to stop.")
    print("\n".join(lines), file=out, flush=True)


async def _serve(args: argparse.Namespace, out: TextIO) -> int:
    def on_step(at: float, text: str) -> None:
        print(f"[t={at:8.1f}s] {text}", file=out, flush=True)

    from bridge.simulator.server import Simulator

    sim = Simulator(
        provider=args.provider,
        scenario=args.scenario,
        speed=args.speed,
        host=args.host,
        port=args.port,
        on_step=on_step,
    )
    from bridge.infra import platform

    stop = asyncio.Event()
    platform.current().install_stop_handlers(
        asyncio.get_running_loop(), lambda _name: stop.set(), stop.set
    )
    await sim.start()
    try:
        _banner(sim, out)
        await stop.wait()
    finally:
        await sim.stop()
    print("simulator stopped", file=out, flush=True)
    return 0


def run(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C / SIGTERM; returns the process exit code."""
    # Imported here, not with the module: the main CLI mounts `add_arguments` at every start
    # (a running sidecar included), and the scenarios are only the simulator's business.
    from bridge.simulator.scenario import ScenarioError, list_scenarios

    if args.list_scenarios:
        for name, description in list_scenarios():
            print(f"{name:28} {description}")
        return 0
    if args.speed <= 0:
        print("error: --speed must be > 0", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_serve(args, sys.stdout))
    except (ScenarioError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point (``python -m bridge.simulator``)."""
    parser = argparse.ArgumentParser(
        prog="maintenance-bridge simulate",
        description="Local GCE metadata server / Azure Scheduled Events / AWS IMDS simulator",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
