"""`python -m bench.fleet_check` still runs (tiny sizes). Not a timed test: it checks that
every part printed a figure, never what the figures are."""

from __future__ import annotations

import pytest

from bench.fleet_check import main


def test_the_check_benchmark_prints_each_part(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--events", "300", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "300 events (" in out
    for part in ("split", "classify", "commit", "screen", "total"):
        assert f"  {part} " in out
