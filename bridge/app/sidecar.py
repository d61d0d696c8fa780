"""The sidecar's programs: `run` (until a signal or the Windows service stops it), `once`,
`doctor` and `validate-config`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.app.exits import EXIT_CONFIG, EXIT_FAILURE, EXIT_OK
from bridge.app.signals import stop_on_signals
from bridge.config import Config, ConfigError, load_config, parse_config

if TYPE_CHECKING:
    from bridge.runner import ProviderName

log = logging.getLogger("bridge")


def load(path: Path | None) -> tuple[Config, Path | None]:
    """The configuration (stdout when no sink is configured) and the file it came from."""
    config, source = load_config(path)
    if not config.sinks:
        config = config.with_sinks(parse_config({"sinks": [{"type": "stdout"}]}).sinks)
    return config, source


async def _detect_until_stopped(config: Config, stop: asyncio.Event) -> ProviderName | None:
    """Detect the cloud, retrying with backoff; None when asked to stop first."""
    from bridge.infra.backoff import retry_logger, retry_until_done
    from bridge.providers.detect import DetectionError, detect

    async def attempt() -> ProviderName | None:
        return None if stop.is_set() else await detect(config.source)

    async def until_stopped(delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)

    return await retry_until_done(
        attempt,
        retry_on=DetectionError,
        initial=2.0,
        maximum=60.0,
        before_sleep=retry_logger(log, "no cloud detected"),
        sleep=until_stopped,
    )


async def run(
    config: Config, stop: asyncio.Event | None = None, *, handle_signals: bool = True
) -> int:
    """The sidecar until `stop` is set (or a signal asks; a Windows service stops it)."""
    from bridge.compose import compose
    from bridge.infra import statelock
    from bridge.surface.health import HealthMonitor
    from bridge.surface.listener import ListenerError
    from bridge.surface.routes import serving

    stop = stop or asyncio.Event()
    if handle_signals:
        stop_on_signals(stop)
    monitor = HealthMonitor()
    try:
        with statelock.holding(config.state.dir):
            async with serving(config.listener, monitor):
                monitor.phase = "detecting"
                provider = await _detect_until_stopped(config, stop)
                if provider is None:
                    return EXIT_OK
                bridge = compose(config, [provider])
                monitor.attach(bridge)
                checks = asyncio.create_task(monitor.run_sink_checks(), name="sink-checks")
                try:
                    await bridge.run(stop)
                finally:
                    monitor.phase = "stopping"
                    checks.cancel()
    except statelock.StateDirInUse as exc:
        print(f"maintenance-bridge: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except statelock.StateDirError as exc:  # a restart cannot create it: as a config error
        print(f"maintenance-bridge: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except ListenerError as exc:
        print(f"maintenance-bridge: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


async def serve(path: Path | None, stop: asyncio.Event) -> int:
    """`run` stopped by `stop` alone, no signal handlers (the Windows service's thread)."""
    try:
        config, _ = load(path)
    except ConfigError as exc:
        log.error("%s", exc.render())
        return EXIT_CONFIG
    return await run(config, stop, handle_signals=False)


async def once(config: Config) -> int:
    from bridge import contract
    from bridge.pipeline.events import to_event
    from bridge.providers.detect import DetectionError, detect
    from bridge.runner import watcher_factory

    try:
        provider = await detect(config.source)
    except DetectionError as exc:
        print(f"maintenance-bridge: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    watcher = watcher_factory(config, provider)(None)
    for notice in await watcher.snapshot():
        sys.stdout.write(contract.encode(to_event(notice)).decode() + "\n")
    return EXIT_OK


async def doctor(args: argparse.Namespace, config: Config, source: Path | None) -> int:
    from bridge.surface.doctor import Doctor, logs_kept_for_the_report, render

    checks = Doctor(config, source, args.timeout)
    with logs_kept_for_the_report(keep=not args.verbose) as logged:
        findings = await checks.run(send_test_event=args.send_test_event)
    sys.stdout.write(render(findings, logged))
    return EXIT_FAILURE if any(f.verdict == "fail" for f in findings) else EXIT_OK


def validate_config(path: Path | None) -> int:
    """`validate-config`: a summary line when valid (a mistake raises `ConfigError`)."""
    config, found = load_config(path)
    where = found or "defaults and environment"
    approving = config.approval.leader != "none" and (
        config.approval.rules or config.approval.preset
    )
    print(
        f"{where}: valid ({len(config.sinks)} sink(s): "
        f"{', '.join(config.sink_names()) or 'none, stdout will be used'}; "
        f"{len(config.hooks)} hook(s); Azure approval "
        f"{'leader = ' + config.approval.leader if approving else 'off'})"
    )
    return EXIT_OK
