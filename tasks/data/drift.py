"""Drift aggregates in Spark, built-in functions only: quantile bin edges of the training side
(one ``percentile_approx`` pass over every column), bin counts of any number of columns (one
group-by over ``(column, bin)`` pairs) and the customers a reference never saw (an anti-join
count). Only per-bin counts come back to the driver, never rows.

Bins follow :mod:`tasks.data.stability`: a value's bin is the number of edges below it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from tasks.data.stability import NULL_BIN, bin_edges, quantile_probabilities


def quantile_edges(
    df: DataFrame, columns: Sequence[str], bins: int, accuracy: int
) -> dict[str, list[float]]:
    """Per column, the distinct edges of its ``bins`` quantiles (one aggregation pass)."""
    if not columns:
        return {}
    probabilities = quantile_probabilities(bins)
    row = df.agg(
        *[
            F.percentile_approx(F.col(c).cast("double"), probabilities, accuracy).alias(c)
            for c in columns
        ]
    ).first()
    return {c: bin_edges(row[c] or []) if row else [] for c in columns}


def bin_column(column: Column, edges: Sequence[float]) -> Column:
    """The bin of each value: the number of edges below it (``NULL_BIN`` for null or NaN)."""
    value = column.cast("double")
    index: Column = F.lit(0)
    for edge in edges:
        index = index + (value > F.lit(float(edge))).cast("int")
    return F.when(value.isNull() | F.isnan(value), F.lit(NULL_BIN)).otherwise(index)


def bin_counts(df: DataFrame, edges: Mapping[str, Sequence[float]]) -> dict[str, dict[int, int]]:
    """Rows per bin of every column in ``edges``: one group-by of ``(column, bin)`` pairs."""
    if not edges:
        return {}
    pairs = F.explode(
        F.array(
            *[
                F.struct(F.lit(name).alias("column"), bin_column(F.col(name), e).alias("bin"))
                for name, e in edges.items()
            ]
        )
    )
    counted = df.select(pairs.alias("p")).groupBy("p.column", "p.bin").count().collect()
    out: dict[str, dict[int, int]] = {name: {} for name in edges}
    for row in counted:
        out[row["column"]][int(row["bin"])] = int(row["count"])
    return out


def unseen_count(df: DataFrame, known: DataFrame, key: str = "customer_id") -> int:
    """Distinct ``key`` values of ``df`` that ``known`` does not have (a left anti-join)."""
    ids = df.select(F.col(key).cast("string").alias(key)).distinct()
    seen = known.select(F.col(key).cast("string").alias(key)).distinct()
    return ids.join(seen, key, "left_anti").count()
