"""Draw the floors of the code from the import-linter contracts in pyproject.toml.

The contracts are the rule (`lint-imports` in `make lint`, tests/test_layers.py); the picture
in docs/architecture.md is drawn from them by this script, and tests/test_layers.py checks
that the doc holds what it draws, so the two cannot drift:

    python tools/floors.py            # print the block
    python tools/floors.py --write    # rewrite it in docs/architecture.md
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
DOC: Final = ROOT / "docs" / "architecture.md"
BEGIN: Final = "<!-- floors: drawn by `python tools/floors.py --write` from pyproject.toml -->"
END: Final = "<!-- /floors -->"
WIDTH: Final = 96


def contracts(pyproject: Path = ROOT / "pyproject.toml") -> list[dict[str, Any]]:
    with pyproject.open("rb") as file:
        found: list[dict[str, Any]] = tomllib.load(file)["tool"]["importlinter"]["contracts"]
    return found


def floors(pyproject: Path = ROOT / "pyproject.toml") -> list[tuple[list[str], bool]]:
    """The layers contract's floors, top first: (modules, whether they may import each
    other)."""
    (layers,) = [c for c in contracts(pyproject) if c["type"] == "layers"]
    found = []
    for floor in layers["layers"]:
        independent = ":" not in floor
        names = [name.strip().strip("()") for name in re.split(r"[|:]", floor)]
        found.append((names, independent))
    return found


def render(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The text block: the floors, numbered from the bottom, the named exceptions and the
    forbidden imports."""
    drawn = floors(pyproject)
    lines = ["Each floor imports only itself and the floors below it (every import counts)."]
    for number, (names, independent) in zip(range(len(drawn), 0, -1), drawn, strict=True):
        how = ""
        if len(names) > 1:
            how = "  (siblings, no imports between them)" if independent else "  (siblings)"
        text = "  ".join(names) + how
        lines += textwrap.wrap(
            text,
            WIDTH,
            initial_indent=f"{number:>3}  ",
            subsequent_indent=" " * 7,
            break_on_hyphens=False,
        )
    (layers,) = [c for c in contracts(pyproject) if c["type"] == "layers"]
    lines += ["", "Named exceptions (an import from a lower floor to a higher one):"]
    lines += [f"  {rule}" for rule in layers.get("ignore_imports", [])]
    lines += ["", "Never imported:"]
    for contract in contracts(pyproject):
        if contract["type"] == "forbidden":
            sources = ", ".join(contract["source_modules"])
            forbidden = ", ".join(contract["forbidden_modules"])
            lines.append(f"  {sources} -> {forbidden}")
    return "\n".join(["```", *lines, "```"])


def block_in(doc: str) -> str:
    """What the doc holds between the markers."""
    begin = doc.index(BEGIN) + len(BEGIN)
    return doc[begin : doc.index(END, begin)].strip("\n")


def write(doc_path: Path = DOC) -> None:
    doc = doc_path.read_text(encoding="utf-8")
    begin = doc.index(BEGIN) + len(BEGIN)
    end = doc.index(END, begin)
    doc_path.write_text(f"{doc[:begin]}\n{render()}\n{doc[end:]}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write", action="store_true", help="rewrite docs/architecture.md")
    args = parser.parse_args(argv)
    if args.write:
        write()
    else:
        sys.stdout.write(render() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
