"""Each customer's last events before a cutoff as padded, fixed-length columns.

The features SQL (:func:`tasks.data.feature_sql.sequence_branch`) keeps, per customer, every
event that is among the ``N`` last before one of the run's cutoffs, as a list of structs
(``_seq_events``: the event's rank ``i`` in the customer's history, its time ``t`` in
microseconds, ``amount``, event-type code ``k`` and the raw ``category``/``channel``), and each
output row carries its cutoff (``_seq_cutoff``). :func:`pad_sequences` turns those two columns
into the published ones, the same numpy code for every engine (DuckDB in process, DuckDB in a
Spark task per bucket, Spark SQL through ``mapInArrow``), so they are equal by construction:

* ``seq_length``: how many real events (``<= N``);
* ``seq_gap_days``, ``seq_amount`` (float32), ``seq_event_type``, ``seq_category``,
  ``seq_channel`` (codes): lists of exactly ``N`` values, the most recent event first, zeros
  after the last real one.

Event types are coded 1..4 (:data:`EVENT_TYPE_CODES`), anything else 5; a category or channel
value is coded by a stable hash into ``1 .. CODE_BUCKETS - 1`` (no vocabulary to keep in step
across runs, engines and buckets; a rare collision shares an embedding). 0 is padding or no value.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.definitions.examples import SEQUENCE_PREFIX
from tasks.definitions.feature_specs import DAY_MICROS

EVENT_TYPE_CODES: dict[str, int] = {"purchase": 1, "view": 2, "add_to_cart": 3, "return": 4}
OTHER_EVENT_TYPE = 5
CODE_BUCKETS = 1024
EVENTS = "_seq_events"
CUTOFF = "_seq_cutoff"


def sequence_fields(mixes: list[str]) -> list[pa.Field]:
    """The published columns, for an input with the mix columns ``mixes``."""
    fields = [
        pa.field(f"{SEQUENCE_PREFIX}length", pa.int32()),
        pa.field(f"{SEQUENCE_PREFIX}gap_days", pa.list_(pa.float32())),
        pa.field(f"{SEQUENCE_PREFIX}amount", pa.list_(pa.float32())),
        pa.field(f"{SEQUENCE_PREFIX}event_type", pa.list_(pa.int8())),
    ]
    return fields + [pa.field(f"{SEQUENCE_PREFIX}{col}", pa.list_(pa.int16())) for col in mixes]


def value_code(value: str) -> int:
    """A category or channel value's code in ``1 .. CODE_BUCKETS - 1`` (stable everywhere)."""
    digest = hashlib.md5(value.encode(), usedforsecurity=False).digest()
    return 1 + int.from_bytes(digest[:4], "big") % (CODE_BUCKETS - 1)


def _codes(values: pa.Array) -> np.ndarray:
    """:func:`value_code` of each string (0 for null), hashing each distinct value once."""
    encoded = pc.dictionary_encode(values.cast(pa.string()))
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    table = np.array([value_code(v) for v in encoded.dictionary.to_pylist()] + [0], np.int16)
    index = encoded.indices.to_numpy(zero_copy_only=False)
    index = np.where(pc.is_null(encoded.indices).to_numpy(zero_copy_only=False), -1, index)
    return table[index.astype(np.int64)]


def _fixed(values: np.ndarray, rows: int, length: int, arrow_type: pa.DataType) -> pa.Array:
    """A ``rows x length`` matrix as a list column of exactly ``length`` values per row."""
    offsets = pa.array(np.arange(0, rows * length + 1, length, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1), arrow_type))


def pad_sequences(batch: pa.RecordBatch | pa.Table, length: int, mixes: list[str]):
    """``batch`` with :data:`EVENTS` and :data:`CUTOFF` replaced by the sequence columns (see
    the module's docstring): per row, the events at or before its cutoff, the ``length`` latest
    by rank, the most recent first."""
    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    rows = table.num_rows
    events = table.column(EVENTS).combine_chunks()
    cutoff = table.column(CUTOFF).to_numpy(zero_copy_only=False).astype(np.int64)
    parent = pc.list_parent_indices(events).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(events)
    if isinstance(flat, pa.ChunkedArray):
        flat = flat.combine_chunks()
    rank = flat.field("i").to_numpy(zero_copy_only=False).astype(np.int64)
    t = flat.field("t").to_numpy(zero_copy_only=False).astype(np.int64)
    before = t <= cutoff[parent]
    # per row, the latest ranks first; the row's first `length` of them are its sequence
    order = np.flatnonzero(before)[np.lexsort((-rank[before], parent[before]))]
    row = parent[order]
    position = np.arange(order.size) - np.searchsorted(row, row, side="left")
    keep = position < length
    order, row, position = order[keep], row[keep], position[keep]

    def matrix(values: np.ndarray, dtype) -> np.ndarray:
        out = np.zeros((rows, length), dtype=dtype)
        out[row, position] = values[order]
        return out

    gap = (cutoff[parent] - t) / DAY_MICROS
    amount = flat.field("amount").to_numpy(zero_copy_only=False).astype(np.float64)
    kind = flat.field("k").to_numpy(zero_copy_only=False).astype(np.int8)
    columns = {
        f"{SEQUENCE_PREFIX}length": pa.array(
            np.bincount(row, minlength=rows).astype(np.int32), pa.int32()
        ),
        f"{SEQUENCE_PREFIX}gap_days": _fixed(matrix(gap, np.float32), rows, length, pa.float32()),
        f"{SEQUENCE_PREFIX}amount": _fixed(
            matrix(np.nan_to_num(amount), np.float32), rows, length, pa.float32()
        ),
        f"{SEQUENCE_PREFIX}event_type": _fixed(matrix(kind, np.int8), rows, length, pa.int8()),
    }
    for col in mixes:
        codes = matrix(_codes(flat.field(col)), np.int16)
        columns[f"{SEQUENCE_PREFIX}{col}"] = _fixed(codes, rows, length, pa.int16())
    kept = table.drop_columns([EVENTS, CUTOFF])
    names = kept.column_names + [f.name for f in sequence_fields(mixes)]
    arrays = [kept.column(i).combine_chunks() for i in range(kept.num_columns)]
    arrays += [columns[f.name] for f in sequence_fields(mixes)]
    if isinstance(batch, pa.Table):
        return pa.Table.from_arrays(arrays, names=names)
    return pa.RecordBatch.from_arrays(arrays, names=names)
