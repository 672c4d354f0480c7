"""The customer split and the statistics of the normaliser, in Spark.

The normaliser maps each feature ``x`` to ``(signed_log1p(x) - mean) / std`` with mean/std from
the train split; the model applies it itself (:class:`tasks.ml.model.Normalizer`), so batch
scoring and serving take raw features.
"""

from __future__ import annotations

import math

from pydantic import BaseModel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

SPLITS = ("train", "val", "test")


class SplitFractions(BaseModel):
    """Share of customers per split; the rest goes to test."""

    train: float = 0.70
    val: float = 0.15


def signed_log1p(col: Column) -> Column:
    """``sign(x) * log1p(|x|)``: tames heavy tails (amounts, counts) and keeps the sign."""
    return F.signum(col) * F.log1p(F.abs(col))


def assign_split(df: DataFrame, seed: int, fractions: SplitFractions | None = None) -> DataFrame:
    """Add ``split`` from a hash of ``customer_id`` and ``seed``: same customer, same split."""
    fractions = fractions or SplitFractions()
    bucket = F.pmod(F.xxhash64(F.col("customer_id"), F.lit(seed)), F.lit(10_000)) / 10_000.0
    split = (
        F.when(bucket < fractions.train, "train")
        .when(bucket < fractions.train + fractions.val, "val")
        .otherwise("test")
    )
    return df.withColumn("split", split)


def normalizer_statistics(train: DataFrame, features: list[str]) -> tuple[list[float], list[float]]:
    """Mean and std of ``signed_log1p`` of each feature over ``train`` (one small aggregate);
    a constant feature gets std 1 so that normalising never divides by zero."""
    aggs = []
    for f in features:
        x = signed_log1p(F.col(f))
        aggs += [F.avg(x).alias(f"m_{f}"), F.stddev_pop(x).alias(f"s_{f}")]
    row = train.agg(*aggs).first()
    if row is None:
        raise ValueError("cannot fit a normaliser on an empty train split")
    mean = [float(row[f"m_{f}"] or 0.0) for f in features]
    std = []
    for f in features:
        s = row[f"s_{f}"]
        std.append(float(s) if s is not None and math.isfinite(s) and s > 1e-9 else 1.0)
    return mean, std
