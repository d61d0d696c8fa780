"""The arguments of `maintenance-bridge fleet ...`, beside bridge/cli.py (which mounts them) so
that each file reads as one command line: the sidecar's there, the fleet service's here.
Building them imports nothing of the fleet: the sidecar's `run` builds the same parser."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_fleet_parser(commands: Any) -> None:
    """`fleet [serve|status|validate-config|export|backup|restore|allow-attestation]` (run by
    bridge/app/fleet.py, imported only then)."""
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
