"""`elect`: the program around `Elector` (bridge/actions/coordination/elect.py): its settings
from the command line and `[coordination]`, its signals, its exit status."""

from __future__ import annotations

import argparse
import asyncio

import msgspec

from bridge.actions.coordination.elect import Elector
from bridge.actions.coordination.settings import Coordination
from bridge.config import Config
from bridge.infra import platform
from bridge.infra.validation import validate


def settings_from(args: argparse.Namespace, configured: Coordination | None) -> Coordination:
    """The etcd settings: `--endpoint` wins over `[coordination]`."""
    if configured is not None:
        settings = configured
        if args.endpoint:
            endpoints = validate(Coordination, {"endpoints": args.endpoint}).endpoints
            settings = msgspec.structs.replace(settings, endpoints=endpoints)
        return settings
    return validate(Coordination, {"endpoints": args.endpoint}, "--endpoint")


async def main(args: argparse.Namespace, config: Config) -> int:
    """Lead while eligible; the command's exit status. A signal ends the command and the
    leadership (in that order) and only then the program: no second-signal exit, no reload."""
    command = list(args.program)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise SystemExit("maintenance-bridge elect: give the command after --")
    settings = settings_from(args, config.coordination)
    try:
        elector = Elector(
            settings,
            args.election,
            command,
            eligible_url=args.eligible_url,
            value=args.value,
            ttl=args.ttl,
            interval=args.interval,
            grace=args.grace,
        )
    except RuntimeError as exc:
        raise SystemExit(f"maintenance-bridge elect: {exc}") from None
    platform.current().install_stop_handlers(
        asyncio.get_running_loop(), lambda _name: elector.stop.set(), lambda: None
    )
    try:
        return await elector.run()
    finally:
        await elector.aclose()
