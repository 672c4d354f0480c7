"""Counting NaN and infinite values of an Arrow column (the features' and the snapshot's
check that every published feature is a finite number)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def non_finite_count(column: pa.Array | pa.ChunkedArray) -> int:
    """How many values of the floating ``column`` are NaN or infinite (nulls are not): its
    non-null values less its finite ones, from one ``is_finite`` pass."""
    finite = int(pc.sum(pc.is_finite(column)).as_py() or 0)
    return len(column) - column.null_count - finite
