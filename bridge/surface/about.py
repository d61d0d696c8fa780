"""`--version`: the build, the event schema it writes and the platform it runs on.

Computed only when asked for (an argparse action), so no other command pays for it.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence
from typing import Any

from bridge import contract
from bridge.infra import platform as platforms
from bridge.infra.buildinfo import NAME, version


def describe() -> str:
    """What `--version` prints: the build, the event schema it writes, the platform."""

    python = f"{platform.python_implementation()} {platform.python_version()}"
    return (
        f"{NAME} {version()}\n"
        f"event schema {contract.SCHEMA_VERSION} ({contract.SCHEMA_URI})\n"
        f"platform {platforms.name()} {platform.machine()}, {python}\n"
    )


class ShowVersion(argparse.Action):
    """`--version`: prints `describe()` and exits; computed only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "print the version, the event schema version and the platform")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any, **_kwargs: Any) -> None:
        sys.stdout.write(describe())
        parser.exit()
