"""The customer split and the statistics of the normaliser, in Spark.

The normaliser maps each feature ``x`` to ``(signed_log1p(x) - mean) / std`` with mean/std from
the train split; the model applies it itself (:class:`tasks.ml.normalizer.Normalizer`), so batch
scoring and serving take raw features.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

SPLITS = ("train", "val", "test")


class SplitFractions(BaseModel):
    """Share of customers per split; the rest goes to test."""

    train: float = 0.70
    val: float = 0.15


def signed_log1p_sql(column: str) -> str:
    """``sign(x) * log1p(|x|)`` of the column ``column`` as Spark SQL: tames heavy tails
    (amounts, counts) and keeps the sign."""
    return f"signum(`{column}`) * log1p(abs(`{column}`))"


HASH_BITS = 32
"""The split hashes each customer to a 32-bit bucket (the first 8 hex digits of an md5) in SQL
that Spark and DuckDB (:mod:`tasks.data.split_in_process`) both run."""
_HEX_DIGITS = "0123456789abcdef"


def split_bucket_sql(column: str, seed: int) -> str:
    """A customer's bucket in ``[0, 2**32)`` as SQL both engines compute natively: the first 8
    hex digits of ``md5('<id>|<seed>')`` (its UTF-8 bytes) read as a number."""
    digest = f"md5(concat({column}, '|{int(seed)}'))"
    digits = [
        f"CAST(instr('{_HEX_DIGITS}', substr({digest}, {i + 1}, 1)) - 1 AS BIGINT)"
        f" * {16 ** (HASH_BITS // 4 - 1 - i)}"
        for i in range(HASH_BITS // 4)
    ]
    return "(" + " + ".join(digits) + ")"


def split_sql(
    seed: int, fractions: SplitFractions | None = None, column: str = "customer_id"
) -> str:
    """``split`` of a customer as SQL (Spark SQL and DuckDB): its bucket against the fractions'
    bounds, whole numbers both engines compare exactly. Same customer and seed, same split."""
    fractions = fractions or SplitFractions()
    bucket = split_bucket_sql(column, seed)
    train = int(fractions.train * 2**HASH_BITS)
    val = int((fractions.train + fractions.val) * 2**HASH_BITS)
    return f"CASE WHEN {bucket} < {train} THEN 'train' WHEN {bucket} < {val} THEN 'val' ELSE 'test' END"


def assign_split(df: DataFrame, seed: int, fractions: SplitFractions | None = None) -> DataFrame:
    """Add ``split`` by :func:`split_sql`: same customer, same split."""
    return df.withColumn("split", F.expr(split_sql(seed, fractions)))


def split_count_columns() -> list[Column]:
    """Aggregates counting the rows of each split (``n_<split>``)."""
    return [F.count(F.when(F.col("split") == s, 1)).alias(f"n_{s}") for s in SPLITS]


def normalizer_aggregates(features: list[str]) -> list[Column]:
    """Aggregates of ``signed_log1p`` of each feature over the rows of the train split
    (``m_<feature>``, ``s_<feature>``): computed by the job that writes the snapshot. Written as
    SQL: one Py4J call per aggregate, where a ``Column`` expression costs one per operation."""
    aggs = []
    for f in features:
        x = f"CASE WHEN split = 'train' THEN {signed_log1p_sql(f)} END"
        aggs += [F.expr(f"avg({x}) AS `m_{f}`"), F.expr(f"stddev_pop({x}) AS `s_{f}`")]
    return aggs


def non_finite_aggregates(features: list[str]) -> list[Column]:
    """Aggregates counting each feature's NaN and infinite values over every row
    (``nf_<feature>``; a null is no value, not counted)."""
    aggs = []
    for f in features:
        x = f"CAST(`{f}` AS DOUBLE)"
        bad = f"isnan({x}) OR abs({x}) = CAST('Infinity' AS DOUBLE)"
        aggs.append(F.expr(f"count(CASE WHEN {bad} THEN 1 END) AS `nf_{f}`"))
    return aggs


def non_finite_features(values: dict[str, Any], features: list[str]) -> dict[str, int]:
    """The features with NaN or infinite values and how many, from ``nf_<feature>`` values
    (:func:`non_finite_aggregates`; ``split_in_process.split_values``)."""
    return {f: int(values.get(f"nf_{f}") or 0) for f in features if values.get(f"nf_{f}")}


def normalizer_from(values: dict[str, Any], features: list[str]) -> tuple[list[float], list[float]]:
    """Mean and std per feature from :func:`normalizer_aggregates`' values; a constant feature
    gets std 1 so that normalising never divides by zero."""
    mean = [float(values[f"m_{f}"] or 0.0) for f in features]
    std = []
    for f in features:
        s = values[f"s_{f}"]
        std.append(float(s) if s is not None and math.isfinite(s) and s > 1e-9 else 1.0)
    return mean, std
