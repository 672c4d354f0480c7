"""The drift check's aggregation on a million customers: every feature's bin counts in one
group-by of ``(feature, bin)`` pairs (``tasks.data.drift.bin_counts``, what the drift check runs)
against one group-by per feature (the straightforward way) in the same Spark session.

Both count the same bins of the same Parquet (46 features, edges from the data's deciles) and
must agree exactly. Prints each side's seconds and the ratio (one pass / per feature), for a
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
from pyspark.sql import functions as F

from infra.settings import HybridflowSettings
from infra.spark import get_spark
from tasks.data.drift import bin_column, bin_counts, quantile_edges
from tasks.data.features import feature_names

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
        rows = df.groupBy(bin_column(F.col(name), e).alias("bin")).count().collect()
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
        for attempt in ("first", "second"):
            started = time.perf_counter()
            one_pass = bin_counts(df, edges)
            subject_s = time.perf_counter() - started
            started = time.perf_counter()
            baseline = _per_feature(df, edges)
            baseline_s = time.perf_counter() - started
            assert one_pass == baseline, "the two ways counted different bins"
            rows.append(
                {
                    "benchmark": "drift bin counts",
                    "run": attempt,
                    "rows": ROWS,
                    "features": len(FEATURES),
                    "subject": "one group-by of (feature, bin)",
                    "subject_s": subject_s,
                    "baseline": "one group-by per feature",
                    "baseline_s": baseline_s,
                    "ratio": subject_s / baseline_s,
                }
            )
        df.unpersist()
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)
