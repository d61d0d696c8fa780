"""The benchmark suite still runs end to end (its quickest mode, tiny sizes).

Not a timed test: it asserts that every part produced figures and that the report, the
figures' JSON and the plot were written, never what the figures are.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.__main__ import main
from bench.report import load

pytestmark = pytest.mark.slow


def test_the_quick_benchmark_writes_a_report_and_a_plot(tmp_path: Path) -> None:
    assert (
        main(["--quick", "--transitions", "4", "--idle-seconds", "1", "--out", str(tmp_path)]) == 0
    )

    report = (tmp_path / "report.md").read_text()
    for section in (
        "## Targets",
        "## Notice-to-delivery latency",
        "## Footprint and idle cost",
        "## Start-up",
        "## Spool and backlog drain",
    ):
        assert section in report
    for watcher in ("bridge, GCE long poll", "Google's sample", "bridge, Azure 1 s poll",
                    "bridge, Azure 0.25 s poll", "Microsoft's sample"):  # fmt: skip
        # against our simulator and receiver, and against the plain http.server ones
        for suffix in ("", " (plain http.server)"):
            row = next(
                line
                for line in report.splitlines()
                if line.startswith(f"| {watcher}") and line.split(" |")[0].endswith(suffix)
            )
            assert "| 4 of 4 |" in row  # every transition was seen and timed
    assert "plain synchronous client" in report  # the drain's yardstick ran
    for watcher in ("bridge, AWS 1 s poll", "bridge, AWS 0.25 s poll"):
        row = next(line for line in report.splitlines() if line.startswith(f"| {watcher}"))
        assert "| 2 of 2 |" in row  # AWS plays half as many transitions
    assert "| bridge, AWS 1 s, webhook sink |" in report
    assert "not measured" not in report
    assert "Commit measured: " in report
    assert (tmp_path / "latency.png").read_bytes().startswith(b"\x89PNG")
    figures = load((tmp_path / "results.json").read_text())  # what bench.compare reads
    assert [len(s.total) for s in figures.gce] == [4, 4]
