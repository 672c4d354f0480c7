"""The in-process snapshot's split counts and normaliser statistics are those of the plain
formula (mean and population std of sign(x) * log1p(|x|) over the train split's finite values),
bit for bit: -0.0, NaN, infinities, nulls, whole numbers and chunked columns included."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from tasks.data.split_in_process import split_values


def _reference(table: pa.Table, features: list[str]) -> dict:
    split = np.array(table["split"].to_pylist(), dtype=object)
    out: dict = {f"n_{s}": int(np.count_nonzero(split == s)) for s in ("train", "val", "test")}
    train = split == "train"
    for f in features:
        x = table[f].to_numpy(zero_copy_only=False).astype(np.float64)[train]
        x = np.sign(x) * np.log1p(np.abs(x))
        x = x[np.isfinite(x)]
        out[f"m_{f}"] = float(x.mean()) if x.size else None
        out[f"s_{f}"] = float(x.std()) if x.size else None
    return out


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        both_nan = math.isnan(a) and math.isnan(b)
        return both_nan or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return a == b


def test_split_values_are_the_plain_formulas_bit_for_bit():
    rng = np.random.default_rng(1)
    n = 20_000
    columns = {"split": pa.array(rng.choice(["train", "val", "test"], n))}
    for i in range(6):
        x = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 6)
        x[rng.integers(0, n, 50)] = -0.0
        x[rng.integers(0, n, 5)] = np.nan if i % 2 else np.inf
        columns[f"f{i}"] = pa.array(x, mask=rng.random(n) < 0.01 if i == 4 else None)
    columns["whole"] = pa.array(rng.integers(-5, 100, n))
    columns["negative_zeros"] = pa.array(np.full(n, -0.0))
    columns["all_nan"] = pa.array(np.full(n, np.nan))
    table = pa.table(columns)
    table = pa.concat_tables([table.slice(0, 1000), table.slice(1000)])  # two chunks
    features = [c for c in table.column_names if c != "split"]
    got, want = split_values(table, features), _reference(table, features)
    assert {k: v for k, v in got.items() if not k.startswith("nf_")}.keys() == want.keys()
    assert all(_same(got[k], want[k]) for k in want), {
        k: (got[k], want[k]) for k in want if not _same(got[k], want[k])
    }
    assert got["nf_f1"] == 5 and got["nf_all_nan"] == n and got["m_all_nan"] is None
