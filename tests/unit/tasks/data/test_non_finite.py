"""NaN and infinite values counted, nulls not."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from tasks.data.non_finite import non_finite_count


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1.0, 2.5, -3.0], 0),
        ([math.nan, 1.0, None, math.inf, -math.inf, None], 3),
        ([None, None], 0),
        ([], 0),
    ],
)
def test_counts_nan_and_infinities_not_nulls(values: list[float | None], expected: int) -> None:
    assert non_finite_count(pa.array(values, pa.float64())) == expected


def test_counts_over_chunks() -> None:
    column = pa.chunked_array([[math.nan, 1.0], [None, math.inf]], pa.float32())
    assert non_finite_count(column) == 2
