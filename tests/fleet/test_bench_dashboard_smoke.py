"""The dashboard benchmark still runs end to end on tiny sizes (not a timed test: it checks
that every figure was produced, never what it is)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.dashboard import main

pytestmark = pytest.mark.slow


def test_the_quick_dashboard_benchmark_writes_its_report(tmp_path: Path) -> None:
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "dashboard.md").read_text()
    for line in ("## Targets", "`/` server render p99", "| /instances/<name> (one VM) |"):
        assert line in report
    assert "nan" not in report
