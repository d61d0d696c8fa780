"""Which build this is: the release, the commit it was built from, the platform it runs on.

The release (`bridge.__version__`, semantic versioning) is written by hand at each release.
A build from a git checkout adds its commit as a PEP 440 local label, `0.2.0+g1a2b3c4`, so a
fleet in the middle of a rollout tells two builds of one release apart: `--version`, the
heartbeat's `agent_version`, the `User-Agent` and the `maintenance_bridge_info` metric all
carry this one string.

The commit is found once, when the package is built: setup.py's build step writes it into
`bridge/_build.py` inside the built package (never into the source tree, so a copy of the
sources, like the container build's, cannot carry a stale one). A package built without git
(the container build has no `.git`) gets `COMMIT = None` there, or no such module at all,
and is the plain release. Running from a source checkout (an editable install) there is no
built module either: then the checkout's HEAD is read, once, the first time the version is
needed, never at import (the start-up benchmark counts every millisecond before the first
poll).
"""

from __future__ import annotations

import importlib
import re
from functools import cache
from pathlib import Path
from typing import Final

from bridge import __version__

#: The release this source tree is (the version without the build's label).
RELEASE: Final = __version__
NAME: Final = "maintenance-bridge"
#: The checkout the package runs from, when it does (an editable install).
_CHECKOUT: Final = Path(__file__).resolve().parents[2]
_SHA: Final = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def git_commit(checkout: Path) -> str | None:
    """The abbreviated commit (7 hex digits) of `checkout`'s HEAD, or None when it is not a
    git checkout or its HEAD cannot be read; setup.py asks this at build time, `commit` at
    run time in a checkout.

    Read from the files git keeps (`HEAD`, the ref it names, `packed-refs`; a worktree's
    `.git` file and `commondir` followed) rather than by running git: no git binary needed,
    and about 0.1 ms instead of the 14 ms of a `git rev-parse` on a sidecar's start-up path.
    A layout this does not know (the reftable ref store) reads as None: the plain release.
    """
    dot = checkout / ".git"
    try:
        if dot.is_file():
            pointer = dot.read_text(encoding="utf-8").strip()
            if not pointer.startswith("gitdir:"):
                return None
            gitdir = checkout / pointer.removeprefix("gitdir:").strip()
        elif dot.is_dir():
            gitdir = dot
        else:
            return None
        head = (gitdir / "HEAD").read_text(encoding="utf-8").strip()
        common = gitdir
        if (gitdir / "commondir").is_file():
            common = gitdir / (gitdir / "commondir").read_text(encoding="utf-8").strip()
        found = _resolve(head, gitdir, common)
    except (OSError, UnicodeDecodeError):
        return None
    return found[:7] if found and _SHA.fullmatch(found) else None


def _resolve(head: str, gitdir: Path, common: Path) -> str | None:
    """The object name HEAD's text points at: itself when detached, else its ref's."""
    if not head.startswith("ref:"):
        return head
    ref = head.removeprefix("ref:").strip()
    for base in (gitdir, common):
        if (base / ref).is_file():
            return (base / ref).read_text(encoding="utf-8").strip()
    packed = common / "packed-refs"
    if packed.is_file():
        for line in packed.read_text(encoding="utf-8").splitlines():
            name, _, target = line.partition(" ")
            if target == ref:
                return name
    return None


@cache
def commit() -> str | None:
    """The commit this build was made from (abbreviated), or None when it is not known."""
    try:
        built = importlib.import_module("bridge._build")
    except ImportError:
        return git_commit(_CHECKOUT)
    found = getattr(built, "COMMIT", None)
    return found if isinstance(found, str) and found else None


def build_module(found: str | None) -> str:
    """The text of the generated `bridge/_build.py` naming commit `found` (None: unknown)."""
    return (
        '"""Generated when this package was built (setup.py); not in the sources."""\n\n'
        f"COMMIT = {found!r}\n"
    )


def with_commit(release: str, found: str | None) -> str:
    """`0.2.0+g1a2b3c4`: the release with the commit as a PEP 440 local label."""
    return f"{release}+g{found}" if found else release


@cache
def version() -> str:
    """The version naming this build (see the module docstring)."""
    return with_commit(RELEASE, commit())


def release_of(text: str) -> tuple[int, ...]:
    """The numeric release of a version (`0.2.0+g1a2b3c4` -> (0, 2, 0)); () if it has none."""
    numbers = []
    for part in text.split("+", 1)[0].split("."):
        if not part.isdigit():
            break
        numbers.append(int(part))
    return tuple(numbers)


def newer(one: str, other: str) -> bool:
    """Whether version `one` is a later release than `other` (commits are not ordered)."""
    return release_of(one) > release_of(other)


def user_agent() -> str:
    """The `User-Agent` of every HTTP request the bridge makes."""
    return f"{NAME}/{version()}"
