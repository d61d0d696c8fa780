"""The `maintenance-bridge` command line: the arguments, and which program of bridge/app/ runs.

Nothing here runs a command: each one is a function of `bridge.app`, imported only when chosen,
so that `run` loads neither the fleet nor the simulator.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from bridge.app.exits import EXIT_CONFIG as EXIT_CONFIG
from bridge.app.exits import EXIT_OK
from bridge.config import CONFIG_ENV, Config, ConfigError
from bridge.infra import stdout
from bridge.pipeline.spool import SpoolError
from bridge.surface.about import ShowVersion

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


def build_parser() -> argparse.ArgumentParser:
    from bridge.actions.coordination import elect_args as elect_cli
    from bridge.app import simulate as simulate_args
    from bridge.cli_fleet import add_fleet_parser

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
    add_fleet_parser(commands)

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
    simulate_args.add_arguments(simulate)

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
            from bridge.app import fleet

            return fleet.main(args)
        if command == "demo" and args.fleet:
            from bridge.app.fleet_demo import run_demo

            return asyncio.run(run_demo(args))
        if command == "simulate":
            from bridge.app import simulate

            return simulate.run(args)
        if command == "demo":
            from bridge.app import demo

            return asyncio.run(demo.main(args))
        if command == "service":
            from bridge.app import service

            return service.main(args)
        from bridge.app import sidecar

        if command == "validate-config":
            return sidecar.validate_config(args.config or args.path)
        if command == "spool":
            from bridge.infra.secrets import placeholders_for_missing

            with placeholders_for_missing():  # the spool commands need the sinks' names only
                config, source = sidecar.load(args.config)
        else:
            config, source = sidecar.load(args.config)
        return asyncio.run(_program(args, config, source))
    except ConfigError as exc:
        print(f"maintenance-bridge: {exc.render()}", file=sys.stderr)
        return EXIT_CONFIG
    except SpoolError as exc:
        print(f"maintenance-bridge: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return 130


def _program(
    args: argparse.Namespace, config: Config, source: Path | None
) -> Coroutine[Any, Any, int]:
    """The program of a command that runs on the sidecar's configuration."""
    from bridge.app import sidecar

    if args.command == "run":
        return sidecar.run(config)
    if args.command == "once":
        return sidecar.once(config)
    if args.command == "doctor":
        return sidecar.doctor(args, config, source)
    if args.command == "spool":
        from bridge.app import spool

        return spool.main(args, config)
    from bridge.app import elect

    return elect.main(args, config)
