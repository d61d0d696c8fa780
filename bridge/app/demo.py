"""`demo`: the bridge against the built-in simulator, every event printed."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.app.exits import EXIT_OK
from bridge.app.signals import stop_on_signals
from bridge.config import parse_config
from bridge.infra import stdout

if TYPE_CHECKING:
    from bridge.sinkapi import Sink

log = logging.getLogger("bridge")


def stdout_sink(pretty: bool, on_closed: Callable[[], None]) -> Sink:
    """The demo's one sink: every event on stdout (`on_closed`: nobody reads any more).

    Through the registry, as every sink: `bridge` names the sinks, never imports them."""
    from bridge import sink_registry

    made: Sink = sink_registry.module_for("stdout").StdoutSink(
        "stdout", pretty=pretty, on_closed=on_closed
    )
    return made


async def main(args: argparse.Namespace) -> int:
    from bridge.compose import compose
    from bridge.infra import statelock
    from bridge.providerapi import registry as providers
    from bridge.simulator import Simulator
    from bridge.surface.health import HealthMonitor
    from bridge.surface.routes import serving

    # Azure's advice is a poll a second; under --speed the scenario's seconds pass faster, so
    # the demo polls as often in scenario time (a `Started` of 5 s lasts 0.5 s at --speed 10),
    # within the simulated IMDS's rate limit of 5 requests a second.
    azure_poll = max(1.0 / args.speed, 0.25)
    import tempfile  # here, not at the top: it costs every `run` process 0.8 MiB (shutil, bz2, ...)

    async with Simulator(provider="all", scenario=args.scenario, speed=args.speed) as sim:
        with (
            tempfile.TemporaryDirectory(prefix="maintenance-bridge-demo-") as state_dir,
            statelock.holding(Path(state_dir)),
        ):
            config = parse_config(
                {
                    "source": {
                        "gce": {"metadata_url": sim.gce_url, "long_poll_timeout": 30},
                        "azure": {"imds_url": sim.azure_url, "poll_interval": azure_poll},
                        "aws": {"imds_url": sim.aws_url, "maintenance_poll_interval": 1.0},
                    },
                    "state": {"dir": state_dir},
                    "delivery": {"shutdown_timeout": 2.0},
                    "listener": {"port": 0},  # a free port: never clashes with a real bridge
                }
            )
            stop = asyncio.Event()
            closed = asyncio.Event()

            def output_closed() -> None:  # `demo | head`: nobody reads what comes next
                closed.set()
                stop.set()

            bridge = compose(
                config, providers.names(), [stdout_sink(args.pretty, on_closed=output_closed)]
            )
            monitor = HealthMonitor()
            monitor.attach(bridge)
            stop_on_signals(stop)
            log.info(
                "simulator at %s, playing scenario %r at speed %g (Ctrl-C to stop)",
                sim.base_url,
                args.scenario,
                args.speed,
            )
            async with serving(config.listener, monitor) as listener:
                assert listener is not None
                log.info(
                    "while it plays: curl %s/v1/eligible (or /v1/notices, /metrics, /readyz)",
                    listener.url,
                )
                runner = asyncio.create_task(bridge.run(stop))
                while not stop.is_set() and sim.pending_steps:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 0.5)
                if not stop.is_set():
                    await asyncio.sleep(3.0)  # let the last notices be seen and delivered
                    log.info("scenario over: %d notice(s) delivered", bridge.notices_seen)
                    stop.set()
                await runner
    return stdout.EXIT_OUTPUT_CLOSED if closed.is_set() else EXIT_OK
