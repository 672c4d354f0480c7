"""A model's inputs as one float32 matrix from Arrow data: plain columns, and positions of list
columns named ``column[i]`` (:func:`tasks.definitions.examples.sequence_element`), which is how a
sequence model reads a customer's last events. The snapshot reader, batch scoring and the
endpoint's snapshot build their matrices here, so every family gets its inputs the same way."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.definitions.examples import split_element


def source_columns(inputs: Iterable[str]) -> list[str]:
    """The Arrow/Parquet columns that hold ``inputs`` (a list column once), in first-use order."""
    seen: dict[str, None] = {}
    for name in inputs:
        element = split_element(name)
        seen.setdefault(element[0] if element else name, None)
    return list(seen)


def list_matrix(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A list column whose rows all have the same length as a ``rows x length`` matrix."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    rows = len(column)
    values = pc.list_flatten(column).to_numpy(zero_copy_only=False)
    if rows == 0:
        return values.reshape(0, 0)
    if values.size % rows or np.any(
        pc.list_value_length(column).to_numpy(False) != values.size // rows
    ):
        raise ValueError("a sequence column's rows must all have the same length")
    return values.reshape(rows, values.size // rows)


def input_matrix(data: pa.RecordBatch | pa.Table, inputs: list[str]) -> np.ndarray:
    """``data``'s ``inputs`` as one C-ordered float32 matrix; nulls and NaNs become 0."""
    x = np.empty((data.num_rows, len(inputs)), dtype=np.float32)
    lists: dict[str, np.ndarray] = {}
    for j, name in enumerate(inputs):
        element = split_element(name)
        if element is None:
            x[:, j] = data.column(name).to_numpy(zero_copy_only=False)
            continue
        column, position = element
        if column not in lists:
            lists[column] = list_matrix(data.column(column))
        x[:, j] = lists[column][:, position]
    np.nan_to_num(x, copy=False, nan=0.0, posinf=np.finfo(np.float32).max)
    return x
