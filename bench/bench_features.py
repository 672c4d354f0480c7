"""The features stage on about a million events: Spark (``tasks.stages.features``, local[*]) against
DuckDB computing the same outputs with SQL in one process (:mod:`bench.duckdb_baseline`).

Both read the same events: the validate stage's output, validated by Spark as it is wherever the
features stage runs on Spark (above ``in_process_rows``), so Parquet bucketed by customer, which
the stage computes a Spark task per bucket of (DuckDB in each,
:mod:`tasks.engines.spark.features_per_bucket`) and DuckDB reads as plain Parquet. Both compute the
training examples (46 features at T-H, label "purchased in (T-H, T]"), the scoring features (at
T) and the backtest's examples (at T-2H, label "purchased in (T-2H, T-H]") and write them as
Parquet; the outputs must agree (relative tolerance 1e-6: sums may differ in the last bits from
the order of addition). The stage runs three times per round: with Spark
(``in_process_rows=0``), with Spark on the same events published without their bucket layout
(Spark SQL, as for events executors wrote to S3), and in process
(:mod:`tasks.engines.in_process.features`, what it does up to ``in_process_rows`` events).
Prints each one's seconds against DuckDB's and the events per second, for a first and a second
run. ``BENCH_FEATURES_CUSTOMERS`` sets the size (default 50,000 customers, about 1.08M events).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from bench.duckdb_baseline import feature_sql, training_sql
from tasks.definitions.contract import CONTRACT_COLUMNS
from tasks.definitions.feature_specs import feature_names

ALL_COLUMNS = set(CONTRACT_COLUMNS)
HORIZON_DAYS = 90


def _stage_features(spark, store, validated, in_process_rows: int) -> tuple[float, object]:
    from tasks.data.cutoffs import Origins
    from tasks.stages.features import build_features

    started = time.perf_counter()
    result = build_features(
        spark,
        store,
        "bench",
        validated,
        validated.last_event.date(),
        HORIZON_DAYS,
        in_process_rows=in_process_rows,
        origins=Origins(count=1),  # the baseline computes one origin (bench_origins: several)
    )
    return time.perf_counter() - started, result


def _duckdb_features(events_glob: str, as_of, out: Path) -> float:
    import duckdb

    from tasks.data.cutoffs import pipeline_cutoffs

    cutoffs = pipeline_cutoffs(as_of, HORIZON_DAYS)
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    started = time.perf_counter()
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW events AS SELECT * FROM read_parquet('{events_glob}')"
    )
    for name, cutoff in (("training", cutoffs.train[0]), ("backtest", cutoffs.backtest[0])):
        sql = training_sql("events", cutoff.at, cutoff.label_until)
        con.execute(f"COPY ({sql}) TO '{out / f'{name}.parquet'}' (FORMAT parquet)")
    sql = feature_sql("events", cutoffs.score.at)
    con.execute(f"COPY ({sql}) TO '{out / 'scoring.parquet'}' (FORMAT parquet)")
    seconds = time.perf_counter() - started
    con.close()
    return seconds


def _unclustered(spark, store, validated):
    """The validated events published again without their bucket layout (two files that split
    customers between them, as executors writing to S3 leave them): Spark SQL's input."""
    from infra.compute.spark_io import read_dataset, write_dataset
    from infra.layout import run_dataset_prefix

    prefix = run_dataset_prefix("bench", "events-unclustered")
    events = read_dataset(spark, store, validated.events_prefix)
    write_dataset(events.repartition(2), store, prefix)
    return validated.model_copy(update={"events_prefix": prefix})


def compare(spark_table, duck_table, names: list[str]) -> float:
    """The largest relative difference between two outputs; raises if they disagree."""
    a = spark_table.sort_by("customer_id")
    b = duck_table.sort_by("customer_id")
    if a.column("customer_id").to_pylist() != b.column("customer_id").to_pylist():
        raise AssertionError("Spark and DuckDB computed features for different customers")
    worst = 0.0
    for name in names:
        x = a.column(name).to_numpy(zero_copy_only=False).astype(float)
        y = b.column(name).to_numpy(zero_copy_only=False).astype(float)
        if not np.allclose(x, y, rtol=1e-6, atol=1e-6):
            bad = int(np.argmax(np.abs(x - y)))
            raise AssertionError(f"{name} differs: spark {x[bad]} vs duckdb {y[bad]}")
        worst = max(worst, float(np.max(np.abs(x - y) / np.maximum(np.abs(y), 1.0))))
    return worst


def _published(store, prefix: str):
    from infra.storage.datasets import read_dataset_manifest

    manifest = read_dataset_manifest(store, prefix)
    return pq.read_table(store.local_path(manifest.data_prefix))


def main(results_dir: Path) -> list[dict]:
    """Generate events, validate them once, compute features with both engines, compare."""
    from infra.compute.spark import get_spark
    from infra.settings import get_settings
    from infra.storage.datasets import read_dataset_manifest
    from infra.storage.store import LocalFolderStore
    from tasks.data.demo_events import DemoDataParams, generate_demo_events
    from tasks.stages.validate import validate_stage

    customers = int(os.environ.get("BENCH_FEATURES_CUSTOMERS", "50000"))
    work = Path(tempfile.mkdtemp(prefix="hf-bench-features-"))
    names = feature_names(ALL_COLUMNS)
    timings = []
    try:
        generate_demo_events(
            DemoDataParams(customers=customers, days=730, seed=3, bad_row_fraction=0.0),
            work / "raw",
        )
        spark = get_spark(get_settings())
        store = LocalFolderStore(work / "store")
        # on Spark, as above in_process_rows, so the Spark arm reads what it reads there:
        # the events bucketed by customer
        validated = validate_stage(
            spark, store, "bench", str(work / "raw"), 0.05, use_cache=False, in_process_rows=0
        )
        events = read_dataset_manifest(store, validated.events_prefix)
        glob = str(store.local_path(events.data_prefix) / "*.parquet")
        unclustered = _unclustered(spark, store, validated)
        for run in ("first", "second"):  # the first Spark run pays JIT and codegen warm-up
            spark_s, result = _stage_features(spark, store, validated, in_process_rows=0)
            sql_s, sql = _stage_features(spark, store, unclustered, in_process_rows=0)
            local_s, local = _stage_features(spark, store, validated, validated.rows_valid)
            out = work / f"duck-{run}"
            out.mkdir()
            duck_s = _duckdb_features(glob, result.as_of, out)
            worst = {}
            for engine, stage in (("spark", result), ("spark_sql", sql), ("in_process", local)):
                if stage.backtest_prefix is None:
                    raise AssertionError(f"the features stage skipped the backtest: {stage}")
                worst[engine] = max(
                    compare(
                        _published(store, prefix),
                        pq.read_table(out / f"{name}.parquet"),
                        [*names, "label"] if labelled else names,
                    )
                    for name, prefix, labelled in (
                        ("training", stage.training_prefix, True),
                        ("backtest", stage.backtest_prefix, True),
                        ("scoring", stage.scoring_prefix, False),
                    )
                )
            jobs = (result.report.spark_jobs, sql.report.spark_jobs)
            timings.append((run, spark_s, sql_s, local_s, duck_s, worst, jobs))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    n = validated.rows_valid
    rows = []
    for run, spark_s, sql_s, local_s, duck_s, worst, jobs in timings:
        common = {"events": n, "customers": customers, "features": len(names)}
        common.update(duckdb_s=duck_s, duckdb_events_per_s=n / duck_s, load=os.getloadavg()[0])
        rows.append(
            {
                "benchmark": f"features ({run} run)",
                "subject": "spark features stage (T-H + labels, T, T-2H + labels): a task per "
                "customer bucket, DuckDB in each",
                "baseline": "duckdb SQL, same outputs",
                "ratio": duck_s / spark_s,
                **common,
                "spark_s": spark_s,
                "spark_events_per_s": n / spark_s,
                "spark_jobs": jobs[0],
                "max_rel_diff": worst["spark"],
            }
        )
        rows.append(
            {
                "benchmark": f"features, Spark SQL ({run} run)",
                "subject": "the same stage on the events without their bucket layout: Spark SQL",
                "baseline": "duckdb SQL, same outputs",
                "ratio": duck_s / sql_s,
                **common,
                "spark_sql_s": sql_s,
                "spark_sql_events_per_s": n / sql_s,
                "spark_jobs": jobs[1],
                "max_rel_diff": worst["spark_sql"],
            }
        )
        rows.append(
            {
                "benchmark": f"features in process ({run} run)",
                "subject": "the same stage in process (DuckDB reads and computes, pyarrow writes)",
                "baseline": "duckdb SQL, same outputs",
                "ratio": duck_s / local_s,
                **common,
                "in_process_s": local_s,
                "in_process_events_per_s": n / local_s,
                "max_rel_diff": worst["in_process"],
            }
        )
    return rows
