"""The customer split and the normaliser's statistics of :mod:`tasks.data.split` on Arrow data in
this process: the same split for every customer (Spark's ``xxhash64`` reproduced with the
``xxhash`` library) and the same statistics, keyed as Spark's aggregates are."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from tasks.data.split import SPLITS, SplitFractions

SPARK_HASH_SEED = 42  # the seed Spark's xxhash64 starts from
BUCKETS = 10_000


def spark_xxhash64(value: str, seed: int) -> int:
    """Spark's ``xxhash64(value, seed)`` of a string and an int column: the string's UTF-8 bytes
    hashed from Spark's seed, then the int's four bytes hashed from that (signed 64-bit)."""
    h = xxhash.xxh64_intdigest(value.encode(), seed=SPARK_HASH_SEED)
    h = xxhash.xxh64_intdigest(struct.pack("<i", seed), seed=h)
    return h - (1 << 64) if h >= 1 << 63 else h


def assign_split(
    customer_ids: pa.ChunkedArray | pa.Array, seed: int, fractions: SplitFractions | None = None
) -> pa.Array:
    """The split of every customer, as :func:`tasks.data.split.assign_split` gives it."""
    fractions = fractions or SplitFractions()
    buckets = np.fromiter(
        (spark_xxhash64(c, seed) % BUCKETS for c in customer_ids.to_pylist()),
        dtype=np.int64,
        count=len(customer_ids),
    )
    share = buckets / float(BUCKETS)
    names = np.array(SPLITS, dtype=object)
    index = np.where(share < fractions.train, 0, 2)
    index[(share >= fractions.train) & (share < fractions.train + fractions.val)] = 1
    return pa.array(names[index], type=pa.string())


def split_values(table: pa.Table, features: list[str]) -> dict[str, Any]:
    """``n_<split>`` and the normaliser's ``m_<feature>``, ``s_<feature>`` (mean and population
    std of ``signed_log1p`` over the train split, None where it has no value), named as
    :func:`tasks.data.split.split_count_columns` and ``normalizer_aggregates`` name them."""
    split = table["split"].to_numpy(zero_copy_only=False)
    values: dict[str, Any] = {f"n_{s}": int(np.count_nonzero(split == s)) for s in SPLITS}
    train = split == "train"
    for f in features:
        x = table[f].to_numpy(zero_copy_only=False).astype(np.float64)[train]
        x = np.sign(x) * np.log1p(np.abs(x))
        x = x[~np.isnan(x)]
        values[f"m_{f}"] = float(x.mean()) if x.size else None
        values[f"s_{f}"] = float(x.std()) if x.size else None
    return values
