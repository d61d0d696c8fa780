"""CONTRIBUTING.md walks a newcomer through the common changes naming each file to touch:
every file and folder it names exists (a `<name>` in a path stands for the one you add)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def named_paths(text: str) -> list[str]:
    """The repository paths in backticks: a folder or a file with an extension, under one of
    the repository's top-level folders."""
    tops = {path.name for path in ROOT.iterdir() if path.is_dir() and not path.name.startswith(".")}
    found = []
    for quoted in re.findall(r"`([^`\s]+)`", text):
        path = quoted.rstrip("/")
        if "/" in path and path.split("/")[0] in tops and "<" not in path:
            found.append(path)
    return found


def test_contributing_names_only_files_that_exist() -> None:
    named = named_paths((ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8"))
    assert len(named) > 40
    assert [path for path in named if not (ROOT / path).exists()] == []


def test_a_placeholder_or_a_missing_file_is_told_apart() -> None:
    text = "`bridge/providers/<cloud>/` `bridge/contract.py` `bridge/nowhere.py` `.venv/bin/x`"
    assert named_paths(text) == ["bridge/contract.py", "bridge/nowhere.py"]
