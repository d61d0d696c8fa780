"""`maintenance-bridge fleet`: serve the fleet service, print its summary, export its audit log,
back up and restore its SQLite store.

The argument parser lives in bridge/cli_fleet.py (building it must not import the fleet: the
sidecar's `run` builds the same parser); this module runs the chosen action with the fleet's
logic (bridge/fleet/), which knows nothing of the command line.

`status` and `export` read the store named by the configuration directly (SQLite beside a
running service is fine: WAL lets readers in; PostgreSQL is shared anyway), so they work
whether or not the service runs. They open it read-only: a store that is not there (a
mistyped `[fleet.store] url`, or no configuration and so the default path) is an error
naming it, never a new empty database.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from bridge import contract
from bridge.app.exits import EXIT_FAILURE, EXIT_OK
from bridge.app.signals import stop_on_signals
from bridge.contract import epoch_rfc3339
from bridge.fleet.api import BadQuery, fleet_summary, moment
from bridge.fleet.backup import BackupError, backup, restore, sqlite_path
from bridge.fleet.config import FleetConfig, load_fleet_config
from bridge.fleet.identity import ledger
from bridge.fleet.service import FleetListenerError, FleetService, build_store
from bridge.fleet.store import EventQuery, Store, StoreError
from bridge.infra import collector

CSV_COLUMNS = ("seq", "received_at", "ingest", "source", "id", "type", "subject", "time", "data")


def main(args: argparse.Namespace) -> int:
    """Run `fleet [serve|status|validate-config|export|backup|restore]`; configuration errors
    propagate to bridge.cli."""
    config = load_fleet_config(args.config)
    action = args.fleet_command or "serve"
    if action == "validate-config":  # loading it validated it: errors went to bridge.cli
        where = args.config or "defaults and environment"
        names = ", ".join(f"{s.name} ({s.type})" for s in config.sources)
        store = config.store.url.split(":", 1)[0]  # never the rest: it may hold a password
        print(f"{where}: valid fleet configuration (sources: {names}; store: {store})")
        return EXIT_OK
    try:
        if action == "serve":
            return asyncio.run(_serve(config))
        if action == "status":
            return asyncio.run(_with_store(config, lambda store: print_status(store, sys.stdout)))
        if action in ("backup", "restore"):
            return _backup_or_restore(config, action, args.path)
        if action == "allow-attestation":
            allow = ledger.allow_command(args.instance, sys.stdout)
            return asyncio.run(_with_store(config, allow, writes=True))
        _known_type(args.type)
        return asyncio.run(_with_store(config, lambda store: _export(store, args, sys.stdout)))
    except (StoreError, FleetListenerError, BadQuery, BackupError) as exc:
        print(f"maintenance-bridge fleet: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def _known_type(name: str | None) -> None:
    """`export --type`: a type no sidecar writes would export nothing, silently."""
    if name is not None and name not in contract.DATA_TYPES:
        raise BadQuery(
            f"--type: unknown event type {name!r}; the types are: "
            + ", ".join(sorted(contract.DATA_TYPES))
        )


async def _serve(config: FleetConfig) -> int:
    stop = asyncio.Event()
    stop_on_signals(stop)
    async with FleetService(config).running():
        collector.settle()  # the start-up's objects frozen, the collector set for serving
        await stop.wait()
    return EXIT_OK


def _backup_or_restore(config: FleetConfig, action: str, path: Path) -> int:
    """`fleet backup PATH` / `fleet restore PATH` of the SQLite store (bridge.fleet.backup)."""
    store = sqlite_path(config, action)
    if action == "backup":
        size = backup(store, path)
        print(f"backed up {store} to {path} ({size:,} bytes)")
    else:
        restore(path, store)
        print(f"restored {store} from {path}")
    return EXIT_OK


async def _with_store(config: FleetConfig, action: Any, *, writes: bool = False) -> int:
    """Run `action` on the configured store, which must exist: read commands open it read-only,
    and a command that `writes` (allow-attestation) checks it exists that way first, so that
    no command but `serve` ever creates a store (a mistyped url is an error naming it)."""
    store = build_store(config.store.url, read_only=True)
    await store.open()
    if writes:
        await store.close()
        store = build_store(config.store.url)
        await store.open()
    try:
        result: int = await action(store)
        return result
    finally:
        await store.close()


def _table(title: str, rows: list[tuple[str, int]], out: IO[str]) -> None:
    out.write(f"\n{title}\n")
    if not rows:
        out.write("  (none)\n")
        return
    width = max(len(name) for name, _ in rows)
    for name, count in rows:
        out.write(f"  {name:<{width}}  {count:>6}\n")


async def print_status(store: Store, out: IO[str]) -> int:
    """The summary (`GET /v1/fleet/summary`) as tables."""
    summary = await fleet_summary(store)
    instances, notices = summary["instances"], summary["notices_in_force"]
    out.write(f"fleet store: {store!r}\n")
    _table(
        "instances",
        [(k, instances[k]) for k in ("total", "reporting", "silent")],
        out,
    )
    _table("instances by provider", sorted(instances["by_provider"].items()), out)
    _table("instances by attestation", sorted(instances["by_attestation"].items()), out)
    out.write(f"\nnotices in force: {notices['total']}\n")
    for key in ("provider", "zone", "kind", "status"):
        _table(f"notices in force by {key}", sorted(notices[f"by_{key}"].items()), out)
    _table("store rows", sorted(summary["store"].items()), out)
    return EXIT_OK


def _rows(store_page: list[tuple[int, str, float, bytes]]) -> Iterator[dict[str, Any]]:
    for seq, ingest, received_at, body in store_page:
        event = json.loads(body)
        yield {
            "seq": seq,
            "received_at": epoch_rfc3339(received_at),
            "ingest": ingest,
            "event": event,
        }


async def _export(store: Store, args: argparse.Namespace, out: IO[str]) -> int:
    """The audit log, oldest first, as JSON lines (each the event as received, with its
    receive time and ingest source) or CSV (one row per event, `data` as JSON)."""
    query = EventQuery(
        instance=args.instance,
        type=args.type,
        since=moment("--since", args.since) if args.since else None,
        until=moment("--until", args.until) if args.until else None,
        limit=1000,
    )
    writer = csv.writer(out) if args.format == "csv" else None
    if writer is not None:
        writer.writerow(CSV_COLUMNS)
    while True:
        page = await store.events(query)
        for row in _rows(page.rows):
            event = row["event"]
            if writer is None:
                out.write(json.dumps(row, separators=(",", ":")) + "\n")
                continue
            writer.writerow(
                [
                    row["seq"],
                    row["received_at"],
                    row["ingest"],
                    event.get("source"),
                    event.get("id"),
                    event.get("type"),
                    event.get("subject"),
                    event.get("time"),
                    json.dumps(event.get("data"), separators=(",", ":")),
                ]
            )
        if page.next_cursor is None:
            return EXIT_OK
        query = dataclasses.replace(query, cursor=page.next_cursor)
