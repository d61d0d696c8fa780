"""`maintenance-bridge fleet`: serve the fleet service, print its summary, export its audit log.

The argument parser lives in bridge/cli.py (building it must not import this package: the
sidecar's `run` builds the same parser); this module runs the chosen action.

`status` and `export` read the store named by the configuration directly (SQLite beside a
running service is fine: WAL lets readers in; PostgreSQL is shared anyway), so they work
whether or not the service runs.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import dataclasses
import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import IO, Any

from bridge.fleet.api import BadQuery, fleet_summary, moment
from bridge.fleet.config import FleetConfig, load_fleet_config
from bridge.fleet.identity import ledger
from bridge.fleet.service import FleetListenerError, FleetService, build_store
from bridge.fleet.store import EventQuery, Store, StoreError

EXIT_OK = 0
EXIT_FAILURE = 1
CSV_COLUMNS = ("seq", "received_at", "ingest", "source", "id", "type", "subject", "time", "data")


def main(args: argparse.Namespace) -> int:
    """Run `fleet [serve|status|export]`; configuration errors propagate to bridge.cli."""
    config = load_fleet_config(args.config)
    action = args.fleet_command or "serve"
    try:
        if action == "serve":
            return asyncio.run(_serve(config))
        if action == "status":
            return asyncio.run(_with_store(config, lambda store: _status(store, sys.stdout)))
        if action == "allow-attestation":
            allow = ledger.allow_command(args.instance, sys.stdout)
            return asyncio.run(_with_store(config, allow))
        return asyncio.run(_with_store(config, lambda store: _export(store, args, sys.stdout)))
    except (StoreError, FleetListenerError, BadQuery) as exc:
        print(f"maintenance-bridge fleet: {exc}", file=sys.stderr)
        return EXIT_FAILURE


async def _serve(config: FleetConfig) -> int:
    from bridge.cli import _install_signal_handlers

    stop = asyncio.Event()
    _install_signal_handlers(stop)
    await FleetService(config).run(stop)
    return EXIT_OK


async def _with_store(config: FleetConfig, action: Any) -> int:
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


async def _status(store: Store, out: IO[str]) -> int:
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
            "received_at": datetime.fromtimestamp(received_at, UTC).isoformat(),
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
