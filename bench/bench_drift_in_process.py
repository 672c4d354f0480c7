"""Where the drift check aggregates: in the flow's process (pyarrow read, numpy quantiles and bin
counts, what ``tasks.stages.drift`` does up to ``HYBRIDFLOW_DRIFT__IN_PROCESS_ROWS``) against
Spark's jobs in a warm session (``percentile_approx`` and the group-by bin counts, what it does
above), on the same published dataset of 46 features.

Both sides start from the dataset's manifest and end with every feature's edges and bin counts;
numpy's counts on Spark's edges must equal Spark's; ``same_edges`` says whether the exact
quantiles equal ``percentile_approx``'s, and ``edge_rank_gap_rows`` how far apart they are. ``BENCH_DRIFT_IN_PROCESS_ROWS`` sets the sizes
(default ``20000,250000``: the demo's customers and the default threshold).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.bench_drift import FEATURES, _write_features
from infra.compute.spark import get_spark
from infra.compute.spark_io import read_dataset
from infra.settings import HybridflowSettings
from infra.storage.arrow_datasets import read_table
from infra.storage.datasets import publish_dataset, read_dataset_manifest
from infra.storage.store import LocalFolderStore
from tasks.data.drift import bin_counts, quantile_edges
from tasks.data.stability import exact_quantile_edges, sample_bin_counts

SIZES = [int(n) for n in os.environ.get("BENCH_DRIFT_IN_PROCESS_ROWS", "20000,250000").split(",")]
BINS = 10


Edges = dict[str, list[float]]
Counts = dict[str, dict[int, int]]


def _in_process(store: LocalFolderStore, prefix: str) -> tuple[Edges, Counts, dict]:
    table = read_table(store, read_dataset_manifest(store, prefix), FEATURES)
    values = {f: table[f].to_numpy() for f in FEATURES}
    edges = {f: exact_quantile_edges(values[f], BINS) for f in FEATURES}
    return edges, {f: sample_bin_counts(values[f], edges[f]) for f in FEATURES}, values


def _in_spark(spark, store: LocalFolderStore, prefix: str) -> tuple[Edges, Counts]:
    df = read_dataset(spark, store, prefix)
    edges = quantile_edges(df, FEATURES, BINS, accuracy=10_000)
    return edges, bin_counts(df, edges)


def _rank_gap(values: dict, exact: Edges, approx: Edges) -> int:
    """How far the two edge sets lie apart: the largest rank distance, in rows, from an edge on
    either side to the nearest edge on the other (``percentile_approx`` promises ranks within
    rows/accuracy; a tie may collapse two edges on one side only)."""
    worst = 0
    for name, column in values.items():
        ordered = np.sort(column)
        ranks = [
            np.searchsorted(ordered, np.asarray(e, dtype=np.float64), side="right")
            for e in (exact[name], approx[name])
        ]
        for mine, other in (ranks, ranks[::-1]):
            if len(mine) and len(other):
                gaps = np.abs(mine[:, None] - other[None, :]).min(axis=1)
                worst = max(worst, int(gaps.max()))
    return worst


def main(results_dir: Path) -> list[dict]:
    """Both ways at each size, twice (the first Spark run pays its codegen)."""
    spark = get_spark(HybridflowSettings())
    rows = []
    for size in SIZES:
        work = Path(tempfile.mkdtemp(prefix="bench-drift-local-"))
        try:
            (work / "data").mkdir()
            _write_features(work / "data", size)
            store = LocalFolderStore(work / "store")
            prefix = "bench/features"
            publish_dataset(store, work / "data", prefix, rows=size)
            for attempt in ("first", "second"):
                started = time.perf_counter()
                local_edges, _, values = _in_process(store, prefix)
                local_s = time.perf_counter() - started
                started = time.perf_counter()
                spark_edges, spark_counts = _in_spark(spark, store, prefix)
                spark_s = time.perf_counter() - started
                on_spark_edges = {f: sample_bin_counts(values[f], spark_edges[f]) for f in values}
                assert on_spark_edges == spark_counts, "numpy and Spark counted different bins"
                rows.append(
                    {
                        "benchmark": "drift aggregation",
                        "run": attempt,
                        "rows": size,
                        "features": len(FEATURES),
                        "subject": "pyarrow + numpy in process",
                        "subject_s": local_s,
                        "baseline": "Spark jobs (warm session)",
                        "baseline_s": spark_s,
                        "ratio": local_s / spark_s,
                        "same_edges": local_edges == spark_edges,
                        "edge_rank_gap_rows": _rank_gap(values, local_edges, spark_edges),
                    }
                )
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return rows
