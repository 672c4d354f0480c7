"""The drift check's aggregation on a million customers: every feature's bin counts as
``tasks.data.drift.bin_counts`` makes them (a group-by of ``(feature, bin)`` pairs per 16 features)
against two baselines in the same Spark session: one group-by per feature (the straightforward
way) and one group-by of all 46 features at once.

All three count the same bins of the same Parquet (46 features, edges from the data's deciles)
and must agree exactly. Prints each side's seconds and the ratio (subject / baseline), for a
first and a second run. ``BENCH_DRIFT_ROWS`` sets the size (default 1,000,000).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame

from infra.compute.spark import get_spark
from infra.settings import HybridflowSettings
from tasks.data.drift import COLUMNS_PER_PASS, bin_column, bin_counts, quantile_edges
from tasks.definitions.feature_specs import feature_names

ROWS = int(os.environ.get("BENCH_DRIFT_ROWS", "1000000"))
FEATURES = feature_names({"event_type", "quantity", "category", "channel"})


def _write_features(path: Path, rows: int) -> None:
    """Zero-inflated counts and skewed amounts, like the real features."""
    rng = np.random.default_rng(0)
    columns = {"customer_id": pa.array([f"C{i:09d}" for i in range(rows)])}
    for i, name in enumerate(FEATURES):
        zeros = rng.uniform(size=rows) < (0.2 + 0.6 * (i % 3) / 2)
        columns[name] = pa.array(np.where(zeros, 0.0, rng.lognormal(1.0 + i % 4, 1.0, rows)))
    pq.write_table(pa.table(columns), path / "part-0.parquet", row_group_size=200_000)


def _per_feature(df: DataFrame, edges: dict[str, list[float]]) -> dict[str, dict[int, int]]:
    """The baseline: one group-by (one pass over the data) per feature."""
    out = {}
    for name, e in edges.items():
        rows = df.groupBy(bin_column(name, e).alias("bin")).count().collect()
        out[name] = {int(r["bin"]): int(r["count"]) for r in rows}
    return out


def main(results_dir: Path) -> list[dict]:
    """Time both ways twice; check they agree."""
    spark = get_spark(HybridflowSettings())
    work = Path(tempfile.mkdtemp(prefix="bench-drift-"))
    try:
        _write_features(work, ROWS)
        df = spark.read.parquet(str(work)).cache()
        df.count()
        edges = quantile_edges(df, FEATURES, bins=10, accuracy=10_000)
        rows = []
        baselines = {
            "one group-by per feature": lambda: _per_feature(df, edges),
            "one group-by of all features": lambda: bin_counts(df, edges, len(edges)),
        }
        for attempt in ("first", "second"):
            started = time.perf_counter()
            subject = bin_counts(df, edges)
            subject_s = time.perf_counter() - started
            for name, baseline in baselines.items():
                started = time.perf_counter()
                assert baseline() == subject, f"{name} counted different bins"
                baseline_s = time.perf_counter() - started
                rows.append(
                    {
                        "benchmark": "drift bin counts",
                        "run": attempt,
                        "rows": ROWS,
                        "features": len(FEATURES),
                        "subject": f"group-by per {COLUMNS_PER_PASS} features",
                        "subject_s": subject_s,
                        "baseline": name,
                        "baseline_s": baseline_s,
                        "ratio": subject_s / baseline_s,
                    }
                )
        df.unpersist()
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)
