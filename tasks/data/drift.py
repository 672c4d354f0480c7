"""Drift aggregates in Spark, built-in functions only: quantile bin edges of the training side
(one ``percentile_approx`` pass over every column), bin counts of any number of columns (a
group-by over ``(column, bin)`` pairs per few columns) and the customers a reference never saw
(an anti-join count). Only per-bin counts come back to the driver, never rows.

Bins follow :mod:`tasks.data.stability`: a value's bin is the number of edges below it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from tasks.data.stability import NULL_BIN, bin_edges, quantile_probabilities

# Columns binned and counted per group-by (bench/bench_drift.py and the 1 Dec figures in
# docs/benchmarks.md): one group-by over all 46 features ran 2-3x slower than passes of 8 columns
# on 1M rows, one group-by per feature about as slow; passes of 16 tie with 8 from 300k to 2M
# rows and take a third off below that, where each pass's job costs more than its rows.
COLUMNS_PER_PASS = 16


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


def bin_column(name: str, edges: Sequence[float]) -> Column:
    """The bin of each value of column ``name``: the number of edges below it (``NULL_BIN``
    for null or NaN), as one flat CASE WHEN (about twice as fast in Spark as summing one
    comparison per edge). It goes to the JVM as one SQL expression: built from Column objects,
    46 features' literals and comparisons took about 2 s of Py4J calls per count, more than
    counting 3,000 customers. The edges are exact double literals (shortest repr + ``D``)."""
    value = f"CAST(`{name.replace('`', '``')}` AS DOUBLE)"
    cases = [f"WHEN {value} IS NULL OR isnan({value}) THEN {NULL_BIN}"]
    cases += [f"WHEN {value} <= {float(edge)!r}D THEN {i}" for i, edge in enumerate(edges)]
    return F.expr(f"CASE {' '.join(cases)} ELSE {len(edges)} END")


def bin_counts(
    df: DataFrame, edges: Mapping[str, Sequence[float]], columns_per_pass: int = COLUMNS_PER_PASS
) -> dict[str, dict[int, int]]:
    """Rows per bin of every column in ``edges``: a group-by of ``(column, bin)`` pairs over
    ``columns_per_pass`` columns at a time (each pass reads only its columns)."""
    names = list(edges)
    out: dict[str, dict[int, int]] = {name: {} for name in names}
    for start in range(0, len(names), columns_per_pass):
        chunk = names[start : start + columns_per_pass]
        pairs = F.explode(
            F.array(
                *[
                    F.struct(
                        F.lit(name).alias("column"),
                        bin_column(name, edges[name]).alias("bin"),
                    )
                    for name in chunk
                ]
            )
        )
        for row in df.select(pairs.alias("p")).groupBy("p.column", "p.bin").count().collect():
            out[row["column"]][int(row["bin"])] = int(row["count"])
    return out


def unseen_count(df: DataFrame, known: DataFrame, key: str = "customer_id") -> int:
    """Distinct ``key`` values of ``df`` that ``known`` does not have (a left anti-join)."""
    ids = df.select(F.col(key).cast("string").alias(key)).distinct()
    seen = known.select(F.col(key).cast("string").alias(key)).distinct()
    return ids.join(seen, key, "left_anti").count()
