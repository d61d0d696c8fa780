"""The command line of `maintenance-bridge elect` (coordination/elect.py), apart so that
building the CLI parser imports no client code."""

from __future__ import annotations

import argparse
from typing import Final

DEFAULT_ELIGIBLE_URL: Final = "http://127.0.0.1:9787/v1/eligible"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("election", help="the election's name (shared by every candidate)")
    parser.add_argument(
        "program",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND [ARG ...]",
        help="the command to run while leader (after --)",
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
    parser.add_argument("--ttl", type=int, default=10, help="lease seconds (default: 10)")
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
