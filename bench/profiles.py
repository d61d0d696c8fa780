"""cProfile summaries that say what costs it: CPU time summed by package, per unit of work."""

from __future__ import annotations

import pstats
from pathlib import Path
from typing import Any


def by_package(stats: pstats.Stats, units: int, unit: str, top: int = 12) -> list[str]:
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]]
    raw = stats.stats  # type: ignore[attr-defined]
    packages: dict[str, float] = {}
    total = 0.0
    for (filename, _, function), (_, _, tottime, _, _) in raw.items():
        package = _package_of(filename)
        if filename == "~" and ("epoll" in function or "select" in function):
            package = "waiting in epoll (idle: the peer's turn, not CPU)"
        packages[package] = packages.get(package, 0.0) + tottime
        total += tottime
    units = max(units, 1)
    lines = [f"CPU by package, {units} {unit}(s), {total:.2f} s profiled:"]
    for package, seconds in sorted(packages.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {seconds / units * 1e6:8.0f} us/{unit}  {seconds / total:5.1%}  {package}")
    return lines


def _package_of(filename: str) -> str:
    path = Path(filename)
    parts = path.parts
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1].removesuffix(".py")
    for ours in ("bridge", "sinks", "bench", "tests"):
        if ours in parts:
            return f"{ours} (this project)"
    if filename.startswith("<") or filename == "~":
        return "interpreter built-ins (sockets, epoll, sqlite3, json)"
    return f"stdlib {path.parent.name if path.parent.name != 'python3.11' else path.stem}"
