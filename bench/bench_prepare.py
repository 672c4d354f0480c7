"""validate + features + preprocess, the stage functions, against the same job in one DuckDB
process (:mod:`bench.duckdb_baseline`: drop bad and duplicate rows, features at T-H with labels
and at T, split and normaliser), on the same demo Parquet, at each size in
``BENCH_PREPARE_CUSTOMERS`` (default ``20000,200000``: about 0.43M and 4.3M events). The stages
run twice: as they run by default (in this process up to ``in_process_rows``) and all on Spark
(``in_process_rows=0``; local[*], JVM already up). All must find the same valid events,
training customers and label rate. Wall and CPU seconds of this process tree (Spark's JVM
included); ratio = stages / DuckDB.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from bench._proc import tree_cpu_seconds

HORIZON_DAYS = 90


def _measured(fn):
    cpu, started = tree_cpu_seconds(), time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started, tree_cpu_seconds() - cpu


def _stages(events: Path, store_dir: Path, in_process_rows: int | None) -> dict:
    from infra.compute.spark import get_spark
    from infra.settings import get_settings
    from infra.storage.store import LocalFolderStore
    from tasks.data.cutoffs import Origins
    from tasks.stages.features import features_stage
    from tasks.stages.preprocess import preprocess_stage
    from tasks.stages.validate import validate_stage

    spark = get_spark(get_settings())
    store = LocalFolderStore(store_dir)
    limit = {"in_process_rows": in_process_rows}
    v = validate_stage(spark, store, "bench", str(events), 0.05, use_cache=False, **limit)
    # one origin, as the baseline computes (bench_origins measures several)
    one = Origins(count=1)
    f = features_stage(
        spark, store, "bench", v, None, HORIZON_DAYS, use_cache=False, origins=one, **limit
    )
    p = preprocess_stage(spark, store, f, 7, use_cache=False, run_id="bench", **limit)
    return {
        "events": v.rows_valid,
        "n_training": f.n_training,
        "positive_rate": f.positive_rate,
        "jobs": sum(r.spark_jobs or 0 for r in (v.report, f.report, p.report)),
        "stage_s": {r.name: round(r.seconds, 2) for r in (v.report, f.report, p.report)},
    }


def _duckdb(events: Path, out: Path) -> dict:
    import duckdb

    from bench.duckdb_baseline import prepare

    con = duckdb.connect()
    try:
        return prepare(con, str(events / "*.parquet"), HORIZON_DAYS, out)
    finally:
        con.close()


def main(results_dir: Path) -> list[dict]:
    """Each size: generate, run both, check they agree, one row."""
    from infra.compute.spark import get_spark
    from infra.settings import get_settings
    from tasks.data.demo_events import DemoDataParams, generate_demo_events

    sizes = [int(s) for s in os.environ.get("BENCH_PREPARE_CUSTOMERS", "20000,200000").split(",")]
    work = Path(tempfile.mkdtemp(prefix="hf-bench-prepare-"))
    rows = []
    try:
        get_spark(get_settings()).range(10).count()  # JVM start, not measured
        for customers in sizes:
            events = work / f"events-{customers}"
            generate_demo_events(DemoDataParams(customers=customers, seed=5), events)
            out = work / f"duck-{customers}"
            duck, duck_s, duck_cpu = _measured(lambda e=events, o=out: _duckdb(e, o))
            for engines, limit in (("as run by default", None), ("all on Spark", 0)):
                stages, stages_s, stages_cpu = _measured(
                    lambda e=events, n=limit: _stages(e, work / "store", n)
                )
                for key in ("events", "n_training"):
                    if stages[key] != duck[key]:
                        raise AssertionError(f"{key}: stages {stages[key]} vs duckdb {duck[key]}")
                if abs(stages["positive_rate"] - duck["positive_rate"]) > 1e-9:
                    raise AssertionError("label rates differ")
                rows.append(
                    {
                        "benchmark": "prepare (validate+features+preprocess)",
                        "subject": f"stages {engines}, {stages['events']:,} events",
                        "baseline": "one DuckDB process",
                        "ratio": stages_s / duck_s,
                        "cpu_ratio": stages_cpu / duck_cpu if duck_cpu else 0.0,
                        "stages_wall_s": stages_s,
                        "duckdb_s": duck_s,
                        "stages_cpu_s": stages_cpu,
                        "duckdb_cpu_s": duck_cpu,
                        "spark_jobs": stages["jobs"],
                        "stages_s": stages["stage_s"],
                        "load": os.getloadavg()[0],
                    }
                )
            shutil.rmtree(events, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows
