"""The command line of `maintenance-bridge elect` (coordination/elect.py), apart so that
building the CLI parser imports no client code."""

from __future__ import annotations

import argparse
from typing import Final

DEFAULT_ELIGIBLE_URL: Final = "http://127.0.0.1:9787/v1/eligible"


def _ttl(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {text!r}") from None
    if not 2 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{value}: must be 2 to 3600 seconds (etcd's minimum)")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("election", help="the election's name (shared by every candidate)")
    parser.add_argument(
        "program",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND [ARG ...]",
        help="the command to run while leader (after --); it and everything it starts end "
        "with elect, however elect ends. Its environment: MB_ELECTION, MB_LEADER_KEY, "
        "MB_FENCING_TOKEN (strictly increases with every new leadership), MB_LEASE_ID",
    )
    parser.add_argument(
        "--endpoint",
        action="append",
        default=[],
        help="etcd client URL (repeatable; default: coordination.endpoints of the config)",
    )
    parser.add_argument(
        "--eligible-url",
        default=DEFAULT_ELIGIBLE_URL,
        help=f"the bridge's eligibility endpoint (default: {DEFAULT_ELIGIBLE_URL})",
    )
    parser.add_argument(
        "--value", default="", help="this candidate's name in etcd (default: the host name)"
    )
    parser.add_argument(
        "--ttl",
        type=_ttl,
        default=10,
        help="lease seconds, 2 to 3600 (default: 10); a leader that cannot renew its lease "
        "stops its command 3/4 of a TTL after the last renewal it sent (SIGKILL by 7/8), "
        "before another can be elected",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="seconds between eligibility checks (default: 1)",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=10.0,
        help="seconds between SIGTERM and SIGKILL to the command (default: 10)",
    )
