"""`python -m bench.compare`: two revisions' benchmarks side by side, and the report of them.

The end-to-end test compares HEAD with HEAD on two quick parts (a checkout of its own for
each side, real child processes, real figures): it asserts that the report is written with
both commits, the load and the sizes, and a ratio for every figure, never what the figures
are. The rest pins the marking rule and the child's refusal to measure another tree.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import bench.__main__ as bench_main
from bench.compare import Figure, Row, main
from bench.procs import ROOT


def _in_git_checkout() -> bool:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, check=False
    )
    return done.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _in_git_checkout(), reason="bench.compare checks revisions out with git")
def test_comparing_head_with_itself_writes_a_report_with_a_ratio_per_figure(
    tmp_path: Path,
) -> None:
    out = tmp_path / "compare.md"
    assert main(["HEAD", "HEAD", "--quick", "--parts", "commit,startup", "--out", str(out)]) == 0

    report = out.read_text()
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert f"Before: {head} (" in report
    assert f"After: {head} (" in report
    assert re.search(r"Load average \(1 min\) around the runs: min \d", report)
    assert "Sizes: transitions 8," in report
    figures = [
        line for line in report.splitlines() if line.startswith("| ") and "(lower is" in line
    ]
    names = " ".join(figures)
    assert "spool commit per notice, p50" in names
    assert "bridge, webhook sink (no cloud SDK): start-up, median" in names
    assert "Google's sample (GCE): start-up, median" in names  # a control: the same code
    for line in figures:
        assert re.search(r"\| \d+\.\d\dx \([+-]\d+%\) \|", line), line
    runs = [line for line in report.splitlines() if line.startswith(("| commit |", "| startup |"))]
    # before and after in turn, each part once per side, none failed
    assert [line.split(" | ")[1] for line in runs] == ["before", "after", "before", "after"]
    # the temporary checkouts are gone from git's list of worktrees
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True, check=True
    ).stdout
    assert "bench-compare-" not in listed


@pytest.mark.parametrize(
    ("before", "after", "higher_is_better", "worse"),
    [
        (10.0, 11.5, False, True),  # a latency up by 15 %
        (10.0, 10.9, False, False),  # up by 9 %: within the tolerance
        (4.0, 4.4, False, False),  # up by 10 % exactly (in floating point, a hair over)
        (10.0, 5.0, False, False),  # down: better
        (1000.0, 850.0, True, True),  # a rate down by 15 %
        (1000.0, 1500.0, True, False),  # a rate up: better
        (float("nan"), 3.0, False, False),  # not measured before: no verdict
    ],
)
def test_a_figure_is_marked_when_worse_by_more_than_ten_percent_in_its_bad_direction(
    before: float, after: float, higher_is_better: bool, worse: bool
) -> None:
    figure = Figure("x", "ms", after, higher_is_better=higher_is_better)
    assert Row(figure, before, after).worse() is worse


def test_the_benchmark_refuses_to_measure_a_bridge_imported_from_another_tree(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(bench_main, "ROOT", tmp_path)
    with pytest.raises(SystemExit, match=r"bridge is imported from .*, not from this benchmark's"):
        bench_main.measured_tree()
