"""The customer split and the normaliser's statistics of :mod:`tasks.data.split` on Arrow data in
this process: the same split for every customer (the same SQL, run by DuckDB) and the same
statistics, keyed as Spark's aggregates are."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from infra.compute.duckdb_session import duckdb_connection
from tasks.data.non_finite import non_finite_count
from tasks.data.split import SPLITS, SplitFractions, split_sql


def assign_split(
    customer_ids: pa.ChunkedArray | pa.Array, seed: int, fractions: SplitFractions | None = None
) -> pa.Array:
    """The split of every customer, as :func:`tasks.data.split.assign_split` gives it (in order)."""
    ids = pa.table({"customer_id": customer_ids})
    con = duckdb_connection()
    try:
        con.register("ids", ids)
        # a projection without ORDER BY keeps the input's order (preserve_insertion_order)
        split = con.sql(f"SELECT {split_sql(seed, fractions)} AS split FROM ids").to_arrow_table()
    finally:
        con.close()
    return split["split"].combine_chunks()


def split_values(table: pa.Table, features: list[str]) -> dict[str, Any]:
    """``n_<split>``, the normaliser's ``m_<feature>``, ``s_<feature>`` (mean and population
    std of ``signed_log1p`` over the train split, None where it has no value) and ``nf_<feature>``
    (NaN and infinite values, floating columns), named as
    :func:`tasks.data.split.split_count_columns`, ``normalizer_aggregates`` and
    ``non_finite_aggregates`` name them."""
    split = table["split"]
    values: dict[str, Any] = {
        f"n_{s}": int(pc.sum(pc.equal(split, s)).as_py() or 0) for s in SPLITS
    }
    train = pc.fill_null(pc.equal(split, "train"), False).to_numpy(zero_copy_only=False)
    for f in features:
        column = table[f]
        if pa.types.is_floating(column.type):
            values[f"nf_{f}"] = non_finite_count(column)
        # sign(x) * log1p(|x|) in one array besides x's gather: the transform of the models'
        # normaliser (tasks.ml.normalizer.signed_log1p), which tasks.data may not import
        x = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)[train]
        y = np.abs(x)
        np.log1p(y, out=y)
        np.multiply(np.sign(x), y, out=y)
        finite = np.isfinite(y)
        if not finite.all():
            y = y[finite]  # a non-finite value is refused (nf_<feature>), not averaged
        values[f"m_{f}"] = float(y.mean()) if y.size else None
        values[f"s_{f}"] = float(y.std()) if y.size else None
    return values
