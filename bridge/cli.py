"""The `maintenance-bridge` command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.config import CONFIG_ENV, Config, ConfigError, load_config, parse_config
from bridge.infra import stdout
from bridge.pipeline.spool import SpoolError
from bridge.surface.about import ShowVersion

if TYPE_CHECKING:
    from bridge.runner import ProviderName

log = logging.getLogger("bridge")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2

DESCRIPTION = """\
Watch the cloud's own VM maintenance notices (GCE metadata server, Azure Scheduled Events,
AWS EC2 instance metadata), turn each change into a CloudEvent of one stable schema, and
deliver it to the configured sinks (stdout, file, webhook, Pub/Sub, Event Hubs, Kafka)
without losing any. `fleet` consumes those events into one fleet state, API and dashboard.

Try it without a cloud account:   maintenance-bridge demo          (the fleet side: demo --fleet)
Run it on a VM:                    maintenance-bridge run --config /etc/maintenance-bridge.toml
"""


def _add_config_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        "-c",
        type=Path,
        default=None,
        help=f"TOML configuration file (default: ${CONFIG_ENV}; without either, built-in "
        "defaults: auto-detect the cloud, print events to stdout)",
    )


def _speed(text: str) -> float:
    """`--speed`: a factor above zero (the scenario's clock runs this many times faster)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: must be above 0 (1 is real time)")
    return value


def _add_fleet_parser(commands: Any) -> None:
    """`fleet [serve|status|validate-config|export|backup|restore]` (run by
    bridge/fleet/cli.py, imported only then)."""
    fleet = commands.add_parser(
        "fleet",
        help="the fleet service: ingest every sidecar's events, serve the fleet state",
        description="Run the fleet service (default), print its summary, export its audit "
        "log, or back up and restore its SQLite store. The service ingests the events of "
        "every sidecar (POST /v1/events, the webhook sink's target), keeps one fleet state "
        "(SQLite by default) and serves /v1/fleet/... (notices, upcoming, instances, "
        "eligible, summary, events), /metrics, /healthz and /readyz. See docs/fleet.md.",
    )
    fleet.add_argument(
        "--config", "-c", type=Path, default=None, help="TOML file with the [fleet] tables"
    )
    actions = fleet.add_subparsers(dest="fleet_command", metavar="ACTION")
    actions.add_parser(
        "serve",
        help="run the fleet service (the default)",
        description="Run the fleet service until SIGTERM or Ctrl-C: ingest the sidecars' "
        "events from the configured sources, keep the fleet state in the store and serve the "
        "API, the dashboard at /, /metrics, /healthz and /readyz (127.0.0.1 unless "
        "[fleet.listener] says otherwise). See docs/fleet.md.",
    )
    actions.add_parser(
        "status",
        help="print the fleet summary as tables",
        description="Print the fleet summary as tables: instances (reporting, silent, by "
        "provider), the notices in force by provider, zone, kind and status, and the store's "
        "row counts. Reads the store named by [fleet.store] url directly, so it works whether "
        "or not the service runs (GET /v1/fleet/summary gives the same as JSON).",
    )
    check = actions.add_parser(
        "validate-config",
        help="check the [fleet] tables of the configuration and exit",
        description="Check the [fleet] tables of the configuration (one file may also hold the "
        "sidecar's tables, which `maintenance-bridge validate-config` checks) and exit: 0 when "
        "valid, 2 with one line per mistake otherwise.",
    )
    export = actions.add_parser(
        "export",
        help="write the audit log (every event as received) for auditors",
        description="Write the fleet's audit log to stdout: every event as it was received "
        "(with when and how it came in), oldest first, as JSON lines or CSV, optionally only "
        "a time range, one instance or one event type. Reads the store directly.",
    )
    export.add_argument("--since", help="event time from (RFC 3339 or Unix seconds)")
    export.add_argument("--until", help="event time before (RFC 3339 or Unix seconds)")
    export.add_argument("--instance", help="only this instance (name or source)")
    export.add_argument("--type", help="only this event type")
    export.add_argument(
        "--format", choices=["jsonl", "csv"], default="jsonl", help="default: jsonl"
    )
    allow = actions.add_parser(
        "allow-attestation",
        help="let an AWS instance enroll once more (its identity document is taken once)",
        description="Let one AWS instance enroll once more. An AWS identity document has no "
        "audience, nonce or expiry, so the fleet takes each instance's document once (trust on "
        "first use) and refuses a second enrollment until an operator allows it here, e.g. "
        "after the instance's sidecar lost its state. Writes to the existing store named by "
        "[fleet.store] url; exits 1 when the instance never enrolled.",
    )
    allow.add_argument("instance", help="the instance's ARN (its events' source)")
    backup = actions.add_parser(
        "backup",
        help="copy the live SQLite store to PATH (consistent, while it serves)",
        description="Copy the live SQLite store to PATH with SQLite's online backup: a "
        "consistent, checked, self-contained file, taken while the service ingests. PATH must "
        'not exist. For a PostgreSQL store use pg_dump (docs/operations.md, "Backups").',
    )
    backup.add_argument("path", type=Path, metavar="PATH", help="a new file for the copy")
    restore = actions.add_parser(
        "restore",
        help="put a backup in place of the SQLite store (the service stopped)",
        description="Put a file made by `fleet backup` in place of the SQLite store named by "
        "[fleet.store] url. Refused while a service has the store open: stop it first.",
    )
    restore.add_argument("path", type=Path, metavar="PATH", help="a file made by fleet backup")
    for sub in (
        actions.choices["serve"],
        actions.choices["status"],
        check,
        export,
        backup,
        restore,
        allow,
    ):
        sub.add_argument(
            "--config", "-c", type=Path, default=argparse.SUPPRESS, help="as for fleet"
        )


def build_parser() -> argparse.ArgumentParser:
    from bridge.actions.coordination import elect_args as elect_cli
    from bridge.simulator import cli as simulator_cli

    parser = argparse.ArgumentParser(
        prog="maintenance-bridge",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=ShowVersion)
    parser.add_argument(
        "--log-format",
        choices=["auto", "text", "json"],
        default="auto",
        help="log lines on stderr: text on a terminal, JSON lines otherwise (default: auto)",
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more detail in the log (-vv for debug)"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = commands.add_parser(
        "run",
        help="watch for notices and deliver them (the sidecar)",
        description="The sidecar: detect the cloud, watch its metadata service for maintenance "
        "notices, spool each change as a CloudEvent and deliver it to every configured sink "
        "(stdout without one), run the configured hooks and approvals, and serve /healthz, "
        "/readyz, /metrics and the status API on the listener (127.0.0.1:9787 by default). "
        "Runs until SIGTERM or Ctrl-C, delivering what is in flight first; after a restart it "
        "resumes from its state directory, announcing nothing twice.",
    )
    _add_config_arg(run)

    once = commands.add_parser(
        "once",
        help="print the notices in force right now as CloudEvents (JSON lines), exit",
        description="Detect the cloud, read its metadata service once and print the notices "
        "in force right now as CloudEvents, one JSON line each (nothing when there is none). "
        "Nothing is spooled, delivered or acted on; the sinks and hooks of the configuration "
        "are not used. Exit status 1 when no cloud is detected.",
    )
    _add_config_arg(once)

    demo = commands.add_parser(
        "demo",
        help="run the bridge against the built-in simulator and print the events",
        description="Start the simulator with a scenario that plays GCE, Azure and AWS notices, "
        "point the bridge at it, and print every CloudEvent it delivers. No cloud account, "
        "no configuration; stops by itself when the scenario is over (or on Ctrl-C).",
    )
    demo.add_argument("--scenario", default="demo", help="scenario name or file (default: demo)")
    demo.add_argument(
        "--speed",
        type=_speed,
        default=1.0,
        help="play the scenario this many times faster (default: 1)",
    )
    demo.add_argument("--pretty", action="store_true", help="indent the printed JSON")
    demo.add_argument(
        "--fleet",
        action="store_true",
        help="play several simulated VMs (GCE and Azure) through real bridges into a local "
        "fleet service over HTTP, and print where to look",
    )
    demo.add_argument(
        "--keep",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --fleet: keep serving the fleet page after the scenarios until Ctrl-C "
        "(default); --no-keep ends with the scenarios",
    )

    commands.add_parser(
        "schema",
        help="print the JSON Schema of the events (version 1)",
        description="Print the JSON Schema (draft 2020-12) of every event the bridge emits, "
        "schema version 1: the file schemas/maintenance-event.v1.json, shipped in the package. "
        "Version 1 only grows additively; consumers ignore fields they do not know.",
    )
    _add_fleet_parser(commands)

    doctor = commands.add_parser(
        "doctor",
        help="check cloud, metadata access, identity, state and sinks; print what to fix",
        description="Detect the cloud, read the metadata service with the bridge's own client "
        "(vendor headers, no redirects, no proxy), read the VM identity and the notices in force, "
        "check the state directory and every sink's credentials and health, and print a table. "
        "Exit status 1 when a check failed.",
    )
    _add_config_arg(doctor)
    doctor.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="deadline of each network step, seconds (default: 10)",
    )
    doctor.add_argument(
        "--send-test-event",
        action="store_true",
        help="also publish one io.maintenancebridge.test event to each sink (not spooled)",
    )

    validate = commands.add_parser(
        "validate-config",
        help="check a configuration file",
        description="Read a configuration file as `run` would (with the environment's "
        "MAINTENANCE_BRIDGE__* overrides and its env:/file: secrets resolved), list every "
        "mistake by its key path, and print a one-line summary when it is valid. Exit "
        "status 2 when it is not. Contacts nothing.",
    )
    validate.add_argument(
        "path", type=Path, nargs="?", default=None, help=f"file to check (default: ${CONFIG_ENV})"
    )
    validate.add_argument(
        "--config", "-c", type=Path, default=None, help="file to check (same as the positional)"
    )

    simulate = commands.add_parser(
        "simulate",
        help="serve a local simulator of the GCE, Azure and AWS metadata services",
        description="Serve the GCE metadata server, Azure Scheduled Events and (with "
        "--provider aws or all) AWS EC2 IMDS on localhost, "
        "playing a scripted scenario; drive it live through /_sim/ (see README).",
    )
    simulator_cli.add_arguments(simulate)

    elect = commands.add_parser(
        "elect",
        help="run a command only while this VM leads an etcd election and is eligible",
        description="Campaign on an etcd election while /v1/eligible says no maintenance is "
        "near, run COMMAND while leader, and on a notice stop it and resign; never campaign "
        "again until eligible. Example: maintenance-bridge elect --endpoint "
        "http://etcd:2379 scheduler -- /usr/bin/scheduler --serve (see docs/coordination.md).",
    )
    _add_config_arg(elect)
    elect_cli.add_arguments(elect)

    spool = commands.add_parser(
        "spool",
        help="inspect the spool: dead letters, replay, purge",
        description="The spool is the bridge's outbox (spool.sqlite3 in [state] dir): every "
        "event waits there until each sink has it; an event a sink refused for good is a dead "
        "letter. These commands work beside a running bridge and need only the sinks' names "
        "from the configuration (not their secrets).",
    )
    spool_commands = spool.add_subparsers(dest="spool_command", metavar="ACTION", required=True)
    for action, text, more in (
        (
            "list",
            "show the queue depth per sink and every dead-lettered event",
            "Print each sink's pending events (and the oldest one's age), then every dead "
            "letter with its sequence number, sink, event id and type, attempts and reason.",
        ),
        (
            "replay",
            "put dead-lettered events back in their sink's queue",
            "Move dead letters back into their sink's queue (all, or those of --sink / --seq): "
            "a running bridge sends them within seconds, a stopped one when it starts. "
            "They keep their ids, so a consumer can still de-duplicate.",
        ),
        (
            "purge",
            "delete dead-lettered events for good",
            "Delete dead letters (all, or those of --sink / --seq) for good. "
            "Run `spool list` first: a purged event is never delivered.",
        ),
    ):
        sub = spool_commands.add_parser(action, help=text, description=more)
        _add_config_arg(sub)
        sub.add_argument("--sink", help="only this sink")
        if action != "list":
            sub.add_argument(
                "--seq",
                type=int,
                action="append",
                help="only this spool sequence number (repeatable)",
            )
    _add_service_parser(commands)
    return parser


def _add_service_parser(commands: Any) -> None:
    service = commands.add_parser(
        "service",
        help="install and control the Windows service (Windows, the [windows] extra)",
        description="Register the bridge as a Windows service (automatic start, restarted after "
        "a failure, logs in %ProgramData%\\maintenance-bridge\\logs), start, stop, query or "
        "remove it. Run as Administrator. On Linux use deploy/systemd instead.",
    )
    actions = service.add_subparsers(dest="service_command", metavar="ACTION", required=True)
    install = actions.add_parser(
        "install",
        help="register the service (automatic start)",
        description="Register maintenance-bridge as a Windows service that starts "
        "automatically and is restarted after a failure, reading --config.",
    )
    install.add_argument(
        "--config",
        "-c",
        type=Path,
        default=None,
        help="configuration file the service reads "
        "(default: %%ProgramData%%\\maintenance-bridge\\config.toml)",
    )
    install.add_argument(
        "--event-log",
        action="store_true",
        help="also write warnings and errors to the Windows Event Log",
    )
    for action, text in (
        ("uninstall", "stop and remove the service"),
        ("start", "start the service"),
        ("stop", "stop the service (it delivers what is in flight first)"),
        ("status", "print the service's state; exit status 3 unless it is running"),
    ):
        actions.add_parser(action, help=text, description=f"Windows: {text}.")


def _service(args: argparse.Namespace) -> int:
    from bridge import service
    from bridge.infra import platform

    try:
        manager = platform.service_manager()
    except RuntimeError as exc:
        print(f"maintenance-bridge service: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    config = getattr(args, "config", None) or platform.current().default_config_file()
    spec = service.ServiceSpec(config.resolve(), getattr(args, "event_log", False))
    try:
        code, message = service.control(args.service_command, manager, spec)
    except service.ServiceError as exc:
        print(f"maintenance-bridge service {args.service_command}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(message, file=sys.stdout if code in (0, 3) else sys.stderr)
    return code


# -- commands -------------------------------------------------------------------------------


def _load(path: Path | None) -> tuple[Config, Path | None]:
    """The configuration (stdout when no sink is configured) and the file it came from."""
    config, source = load_config(path)
    if not config.sinks:
        config = config.with_sinks(parse_config({"sinks": [{"type": "stdout"}]}).sinks)
    return config, source


def _install_signal_handlers(stop: asyncio.Event) -> None:
    """Stop on SIGINT/SIGTERM (Ctrl+C/Ctrl+Break on Windows), exit at once on the second.

    SIGHUP is logged and ignored rather than taken as a reload: swapping sinks, watchers or
    hooks under a running spool is where events get lost or doubled, and a restart (which
    delivers what is in flight and resumes from the checkpoints) applies a change safely.
    """
    from bridge.infra import platform

    requests: list[str] = []

    def requested(name: str) -> None:
        requests.append(name)
        if len(requests) > 1:
            log.warning("received %s again: exiting at once", name)
            os._exit(128 + signal.Signals[name] if name in signal.Signals.__members__ else 1)
        log.info("received %s: shutting down (send it again to exit at once)", name)
        stop.set()

    def hangup() -> None:
        log.warning(
            "received SIGHUP: ignored; the configuration is read at start only, "
            "restart the bridge to apply a change"
        )

    platform.current().install_stop_handlers(asyncio.get_running_loop(), requested, hangup)


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


async def _run(
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
        _install_signal_handlers(stop)
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
        config, _ = _load(path)
    except ConfigError as exc:
        log.error("%s", exc.render())
        return EXIT_CONFIG
    return await _run(config, stop, handle_signals=False)


async def _once(config: Config) -> int:
    from bridge.pipeline.events import serialize, to_cloudevent
    from bridge.providers.detect import DetectionError, detect
    from bridge.runner import watcher_factory

    try:
        provider = await detect(config.source)
    except DetectionError as exc:
        print(f"maintenance-bridge: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    watcher = watcher_factory(config, provider)(None)
    for notice in await watcher.snapshot():
        sys.stdout.write(serialize(to_cloudevent(notice)).decode() + "\n")
    return EXIT_OK


async def _demo(args: argparse.Namespace) -> int:
    from bridge.compose import compose
    from bridge.infra import statelock
    from bridge.providerapi import registry as providers
    from bridge.simulator import Simulator
    from bridge.surface.health import HealthMonitor
    from bridge.surface.routes import serving
    from sinks.stdout import StdoutSink

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

            sink = StdoutSink("stdout", pretty=args.pretty, on_closed=output_closed)
            bridge = compose(config, providers.names(), [sink])
            monitor = HealthMonitor()
            monitor.attach(bridge)
            _install_signal_handlers(stop)
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


async def _doctor(args: argparse.Namespace, config: Config, source: Path | None) -> int:
    from bridge.surface.doctor import Doctor, logs_kept_for_the_report, render

    doctor = Doctor(config, source, args.timeout)
    with logs_kept_for_the_report(keep=not args.verbose) as logged:
        findings = await doctor.run(send_test_event=args.send_test_event)
    sys.stdout.write(render(findings, logged))
    return EXIT_FAILURE if any(f.verdict == "fail" for f in findings) else EXIT_OK


async def _spool(args: argparse.Namespace, config: Config) -> int:
    import datetime as dt

    from bridge.pipeline.spool import Spool

    spool = Spool(config.state.dir, config.sink_names())
    if not spool.path.exists():
        print(f"no spool at {spool.path}", file=sys.stderr)
        return EXIT_FAILURE
    await spool.open()
    try:
        if args.spool_command == "list":
            depth = await spool.depth()
            print(f"spool: {spool.path}")
            for sink, (count, oldest) in sorted(depth.items()):
                if args.sink and sink != args.sink:
                    continue
                age = (
                    f", oldest {dt.datetime.fromtimestamp(oldest, dt.UTC):%Y-%m-%d %H:%M:%S}Z"
                    if oldest
                    else ""
                )
                print(f"pending  {sink}: {count} event(s){age}")
            letters = await spool.dead_letters(args.sink)
            print(f"dead letters: {len(letters)}")
            for d in letters:
                when = dt.datetime.fromtimestamp(d.at, dt.UTC)
                print(
                    f"  seq={d.seq} sink={d.sink} id={d.id} type={d.type} attempts={d.attempts} "
                    f"at={when:%Y-%m-%d %H:%M:%S}Z reason={d.reason}"
                )
        elif args.spool_command == "replay":
            count = await spool.replay(args.sink, args.seq)
            print(
                f"replayed {count} event(s); a running bridge sends them within seconds, a "
                "stopped one when it starts"
            )
        else:
            count = await spool.purge(args.sink, args.seq)
            print(f"purged {count} dead-lettered event(s)")
    finally:
        await spool.close()
    return EXIT_OK


async def _elect(args: argparse.Namespace, config: Config) -> int:
    from bridge.actions.coordination import elect

    return await elect.main(args, config.coordination)


def main(argv: Sequence[str] | None = None) -> int:
    """The console script: every command, the fleet's too, ends quietly when the reader of
    its output goes away (`... | head -1`), see `bridge.infra.stdout`."""
    return stdout.exits_quietly_when_output_closes(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from bridge.infra import logs

    logs.setup(args.log_format, args.verbose)
    stdout.utf8_stdout()
    command: str = args.command
    try:
        if command == "schema":
            from bridge.pipeline.events import schema_text

            sys.stdout.write(schema_text())
            return EXIT_OK
        if command == "fleet":
            from bridge.fleet.cli import main as fleet_main

            return fleet_main(args)
        if command == "demo" and args.fleet:
            from bridge.fleet.demo import run_demo

            return asyncio.run(run_demo(args))
        if command == "simulate":
            from bridge.simulator import cli as simulator_cli

            return simulator_cli.run(args)
        if command == "demo":
            return asyncio.run(_demo(args))
        if command == "service":
            return _service(args)
        if command == "validate-config":
            config, path = load_config(args.config or args.path)
            where = path or "defaults and environment"
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
        if command == "spool":
            from bridge.infra.secrets import placeholders_for_missing

            with placeholders_for_missing():  # the spool commands need the sinks' names only
                config, source = _load(args.config)
        else:
            config, source = _load(args.config)
        runners: dict[str, Any] = {
            "run": lambda: _run(config),
            "once": lambda: _once(config),
            "spool": lambda: _spool(args, config),
            "doctor": lambda: _doctor(args, config, source),
            "elect": lambda: _elect(args, config),
        }
        return int(asyncio.run(runners[command]()))
    except ConfigError as exc:
        print(f"maintenance-bridge: {exc.render()}", file=sys.stderr)
        return EXIT_CONFIG
    except SpoolError as exc:
        print(f"maintenance-bridge: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return 130
