"""`bridge.infra.prometheus.Histogram`: each value counted in the first bucket whose bound
is at least it (found by bisection), in none past the last bound (the `+Inf` bucket is the
total count), never a NaN."""

from __future__ import annotations

import math

import pytest

from bridge.infra.prometheus import Histogram

BOUNDS = (0.1, 0.5, 1.0, 5.0)


@pytest.mark.parametrize(
    ("value", "bucket"),
    [
        (-1.0, 0),
        (0.0, 0),
        (0.1, 0),
        (0.10001, 1),
        (0.5, 1),
        (1.0, 2),
        (4.9, 3),
        (5.0, 3),
        (5.1, None),
        (math.inf, None),
        (math.nan, None),
    ],
)
def test_a_value_lands_in_the_first_bucket_that_holds_it(value: float, bucket: int | None) -> None:
    histogram = Histogram(BOUNDS)
    histogram.observe(value)
    assert histogram.counts == [int(i == bucket) for i in range(len(BOUNDS))]
    assert histogram.count == 1
    assert histogram.cumulative()[-1] == ("+Inf", 1)
