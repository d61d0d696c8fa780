"""bridge.infra.collector: the garbage collector of a served fleet process.

Each check runs in a Python process of its own: settling the test runner's collector would
change how every later test collects."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.test_cli import ROOT

SETTLED = """
import gc, json
from bridge.infra import collector

collector.settle()
before = [generation["collections"] for generation in gc.get_stats()]
in_flight = [{"request": [n], "headers": {"n": n}} for n in range(2_500)]  # alive at once
del in_flight
after = [generation["collections"] for generation in gc.get_stats()]
print(json.dumps({
    "first": gc.get_threshold()[0],
    "frozen": gc.get_freeze_count(),
    "collections": [b - a for a, b in zip(before, after)],
}))
"""


def _settled() -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", SETTLED], capture_output=True, text=True, check=True, cwd=ROOT
    )
    found: dict[str, object] = json.loads(done.stdout)
    return found


def test_the_objects_of_requests_in_flight_trigger_no_collection() -> None:
    settled = _settled()
    assert settled["first"] == 10_000
    # 7,500 containers alive at once: 9 collections of the youngest generation by default.
    assert settled["collections"] == [0, 0, 0]


def test_what_start_up_made_is_frozen_out_of_every_later_collection() -> None:
    assert int(str(_settled()["frozen"])) > 1_000  # the modules, their functions and classes
