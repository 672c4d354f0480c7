"""The cluster path at engine speed: the features stage and batch inference on the local stack's
two-worker Spark cluster (1 core each, the S3 store on a moto server) against one process given
the same two cores (DuckDB with 2 threads; torch with 2 threads), in the same run.

Events: demo events (``BENCH_CLUSTER_CUSTOMERS``, default 50,000 customers = about 1.08M
events), validated in process, then put into the S3 store ordered by time in four files, so
every customer's events are spread over files and nothing records a bucket layout: what the
executors leave when validate runs on a cluster with an S3 store. The features stage
(``in_process_rows=0``) then runs as ``spark-per-partition`` (one shuffle by customer, DuckDB
in each task, :mod:`tasks.engines.spark.features_per_partition`); the "before" is what the stage ran
on such events until then, Spark SQL (:mod:`tasks.data.features`) with the outputs written by
the executors. DuckDB computes the same three outputs (training examples at T-H with labels,
scoring features at T, the backtest's at T-2H) from the same events on local disk, with 2
threads. Every output must agree with DuckDB's (relative 1e-6).

Batch inference: ``BENCH_CLUSTER_INFERENCE_ROWS`` (default 1,000,000) synthetic feature rows in
four files in the S3 store, scored by the stage on the executors (a task per file reads it from
S3, scores it with torch and puts its predictions back) against torch in memory on the same
rows with 2 threads.

Besides wall seconds, each figure has its CPU seconds: for the cluster path those of every
process of the bench's tree (moto's server thread, the master, workers, executors and their
Python workers, the driver), for a baseline its own; ``cpu_ratio`` is the baseline's CPU over the
cluster path's for the same work: its throughput relative to the baseline's on a busy machine,
which moves little with other load on a shared box (the wall ratio is what a user waits for).

Both run through Spark Connect (the stack's way: the server's executors stay up) and as a
client-mode driver (``spark://``: this process's child starts a driver whose executors the
workers launch), each twice (the first pays the executors' Python workers). The arms run in
child processes: a Connect client and a classic driver do not share one Python process.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench._proc import tree_cpu_seconds
from bench.bench_features import ALL_COLUMNS, HORIZON_DAYS, compare, duckdb_features
from bench.bench_inference import AS_OF as INFERENCE_AS_OF
from bench.bench_inference import _register_model, _write_features

CORES = 2  # the cluster: two workers of one core
BUCKET = "hf-bench"
EVENTS_PREFIX = "bench/events-s3"
REPO = Path(__file__).resolve().parent.parent
EVENTS_END = dt.date(2025, 6, 30)
ROOT_PID = "BENCH_CLUSTER_ROOT_PID"


def _valid_events(work: Path, customers: int):
    """Demo events validated in process (local store); their ValidateResult and files."""
    from infra.compute.spark import SparkOnDemand
    from infra.settings import get_settings
    from infra.storage.datasets import read_dataset_manifest
    from infra.storage.store import LocalFolderStore
    from tasks.data.demo_events import DemoDataParams, generate_demo_events
    from tasks.stages.validate import validate_stage

    generate_demo_events(
        DemoDataParams(
            customers=customers,
            days=730,
            seed=3,
            bad_row_fraction=0.0,
            end_date=EVENTS_END,  # not the scoring features' date of the inference arm
        ),
        work / "raw",
    )
    local = LocalFolderStore(work / "local")
    validated = validate_stage(
        SparkOnDemand(get_settings()),
        local,
        "bench",
        str(work / "raw"),
        0.05,
        use_cache=False,
        in_process_rows=10**12,
    )
    manifest = read_dataset_manifest(local, validated.events_prefix)
    return validated, [local.local_path(key) for key in manifest.files]


def _to_s3_unclustered(store, files: list[Path], out: Path) -> int:
    """The events ordered by time in four files, into the store (no layout) and ``out``."""
    from infra.compute.spark_io import spark_schema_metadata
    from infra.storage.datasets import new_data_prefix, publish_written_dataset

    table = pa.concat_tables(pq.read_table(f) for f in files).sort_by("event_time")
    data_prefix = new_data_prefix(EVENTS_PREFIX)
    out.mkdir(parents=True)
    keys, per_file = [], -(-table.num_rows // 4)
    for i, start in enumerate(range(0, table.num_rows, per_file)):
        path = out / f"part-{i}.parquet"
        pq.write_table(table.slice(start, per_file), path)
        key = f"{data_prefix}/part-{i:05d}.parquet"
        store.put_file(key, path)
        keys.append(key)
    publish_written_dataset(
        store,
        EVENTS_PREFIX,
        data_prefix,
        keys,
        rows=table.num_rows,
        metadata=spark_schema_metadata(table.schema),
    )
    return table.num_rows


def _torch_seconds(local_store, version: str) -> tuple[float, float]:
    """Torch in memory on the features' rows with ``CORES`` threads: the best of 3 (wall and
    CPU seconds)."""
    import torch

    from infra.layout import scoring_features_prefix
    from infra.storage.datasets import read_dataset_manifest
    from infra.storage.registry import ModelRegistry
    from tasks.ml.models import load_model, predict_proba

    manifest, files = ModelRegistry(local_store).read_files(version)
    model = load_model(files, manifest.files)
    data = read_dataset_manifest(local_store, scoring_features_prefix(INFERENCE_AS_OF))
    table = pa.concat_tables(pq.read_table(local_store.local_path(f)) for f in data.files)
    x = np.column_stack([table.column(f).to_numpy().astype(np.float32) for f in manifest.features])
    torch.set_num_threads(CORES)
    best = (float("inf"), float("inf"))
    for _ in range(3):
        cpu, started = tree_cpu_seconds(), time.perf_counter()
        predict_proba(model, x)
        best = min(best, (time.perf_counter() - started, tree_cpu_seconds() - cpu))
    return best


def _spark_sql_features(spark, store, validated, as_of) -> float:
    """The way the stage computed unclustered events before: Spark SQL
    (:class:`tasks.engines.spark.features.SparkFeatureFrame`), the executors writing."""
    from tasks.data.cutoffs import Origins, pipeline_cutoffs
    from tasks.engines.feature_frame import FeatureOutput
    from tasks.engines.spark.features import SparkFeatureFrame

    started = time.perf_counter()
    cutoffs = pipeline_cutoffs(as_of, HORIZON_DAYS, Origins(count=1))
    outputs = [
        FeatureOutput(cutoffs.train, "bench/spark-sql/training"),
        FeatureOutput((cutoffs.score,), "bench/spark-sql/scoring"),
        FeatureOutput(cutoffs.backtest, "bench/spark-sql/backtest"),
    ]
    with SparkFeatureFrame(spark, store, validated.events_prefix, outputs, ALL_COLUMNS) as frame:
        for output in outputs:
            frame.publish(output)
    return time.perf_counter() - started


def arm(validated_json: str, duck_dir: str, version: str) -> None:
    """One session's runs (the environment says which: HYBRIDFLOW_SPARK_REMOTE or _MASTER);
    prints one JSON line of timings."""
    from infra.compute.spark import get_spark
    from infra.settings import get_settings
    from infra.storage.arrow_datasets import read_table
    from infra.storage.datasets import read_dataset_manifest
    from infra.storage.store import open_store
    from tasks.data.cutoffs import Origins
    from tasks.definitions.feature_specs import feature_names
    from tasks.reporting.records import ValidateResult
    from tasks.stages.batch_inference import batch_inference_stage
    from tasks.stages.features import build_features

    settings = get_settings()
    store = open_store(settings.store)
    validated = ValidateResult.model_validate_json(validated_json)
    names = feature_names(ALL_COLUMNS)
    spark = get_spark(settings)
    root = int(os.environ.get(ROOT_PID, os.getpid()))  # the bench: moto, the cluster, this driver
    out: dict = {"features": [], "spark_sql": [], "inference": [], "checks": {}}
    out |= {"features_cpu": [], "inference_cpu": []}
    for _ in ("first", "second"):
        cpu, started = tree_cpu_seconds(root), time.perf_counter()
        result = build_features(
            spark,
            store,
            "bench",
            validated,
            validated.last_event.date(),
            HORIZON_DAYS,
            in_process_rows=0,
            origins=Origins(count=1),
        )
        out["features"].append(time.perf_counter() - started)
        out["features_cpu"].append(tree_cpu_seconds(root) - cpu)
        out["spark_sql"].append(
            _spark_sql_features(spark, store, validated, validated.last_event.date())
        )
        cpu, started = tree_cpu_seconds(root), time.perf_counter()
        scored = batch_inference_stage(
            spark, store, INFERENCE_AS_OF, version, progress_interval_s=60, in_process_rows=0
        )
        out["inference"].append(time.perf_counter() - started)
        out["inference_cpu"].append(tree_cpu_seconds(root) - cpu)
    out["checks"]["engine"] = [result.report.engine, result.report.engine_reason]
    out["checks"]["scored"] = scored.rows_scored
    worst = {}
    for name, prefix, labelled in (
        ("training", result.training_prefix, True),
        ("backtest", result.backtest_prefix, True),
        ("scoring", result.scoring_prefix, False),
    ):
        duck = pq.read_table(Path(duck_dir) / f"{name}.parquet")
        columns = [*names, "label"] if labelled else names
        new = read_table(store, read_dataset_manifest(store, prefix))
        old = read_table(store, read_dataset_manifest(store, f"bench/spark-sql/{name}"))
        worst[name] = [compare(new, duck, columns), compare(old, duck, columns)]
    out["checks"]["max_rel_diff"] = worst
    print("ARM " + json.dumps(out))


def _run_arm(mode: str, env: dict[str, str], validated, duck_dir: Path, version: str) -> dict:
    args = [validated.model_dump_json(), str(duck_dir), version]
    return run_arm_process("bench.bench_cluster", args, env, f"{mode} arm")


def run_arm_process(module: str, args: list[str], env: dict[str, str], what: str) -> dict:
    """``module.arm(*args)`` in a child Python process with ``env`` (a driver of its own); the
    JSON it prints on its last ``ARM `` line."""
    code = f"import sys; from {module} import arm; arm(*sys.argv[1:])"
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("ARM ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{what} failed: {done.stderr[-4000:]}")
    return json.loads(lines[-1][4:])


def main(results_dir: Path) -> list[dict]:
    """Start moto and the cluster, run both arms and the baselines; a row per figure."""
    import boto3

    from infra.settings import get_settings
    from infra.stack.processes import launcher_into, stop
    from infra.stack.spark_cluster import (
        CONNECT,
        spark_spec,
        start_cluster,
        stop_cluster,
    )
    from infra.storage.store import LocalFolderStore, S3Store
    from tasks.definitions.feature_specs import feature_names
    from tests.fixtures.moto_s3 import moto_env, start_moto

    customers = int(os.environ.get("BENCH_CLUSTER_CUSTOMERS", "50000"))
    inference_rows = int(os.environ.get("BENCH_CLUSTER_INFERENCE_ROWS", "1000000"))
    work = Path(tempfile.mkdtemp(prefix="hf-bench-cluster-"))
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request lines
    server, endpoint = start_moto()
    aws = moto_env(endpoint)
    saved = {k: os.environ.get(k) for k in aws}
    os.environ.update(aws)
    records: dict = {}
    try:
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        uri = f"s3://{BUCKET}/store"
        store = S3Store(uri)
        validated, files = _valid_events(work, customers)
        events = _to_s3_unclustered(store, files, work / "events")
        validated = validated.model_copy(update={"events_prefix": EVENTS_PREFIX})
        duck_dir = work / "duck"
        duck_dir.mkdir()
        cpu = tree_cpu_seconds()
        duck_s = duckdb_features(
            str(work / "events" / "*.parquet"),
            validated.last_event.date(),
            duck_dir,
            threads=CORES,
        )
        duck_cpu = tree_cpu_seconds() - cpu
        local = LocalFolderStore(work / "inference")
        features = feature_names({"event_type", "category", "channel"})
        for target in (store, local):
            _write_features(target, inference_rows, features)
        version = _register_model(store, features)
        torch_s, torch_cpu = _torch_seconds(local, _register_model(local, features))

        spec = spark_spec(get_settings(), workers=2)
        launch = launcher_into(records, work / "logs", REPO)
        base = {k: v for k, v in os.environ.items() if not k.startswith("HYBRIDFLOW_SPARK")}
        base |= {"HYBRIDFLOW_STORE": uri, "HYBRIDFLOW_WORK_DIR": str(work / "hf")}
        base[ROOT_PID] = str(os.getpid())
        endpoints = start_cluster(launch, work / "cluster", spec, dict(os.environ))
        arms = {
            "Spark Connect": _run_arm(
                "connect",
                base | {"HYBRIDFLOW_SPARK_REMOTE": endpoints.remote},
                validated,
                duck_dir,
                version,
            )
        }
        stop(records.pop(CONNECT), grace_s=10.0)  # its application holds the workers' cores
        arms["spark:// client mode"] = _run_arm(
            "client",
            base
            | {
                "HYBRIDFLOW_SPARK_MASTER": endpoints.master_url,
                "HYBRIDFLOW_SPARK_EXECUTOR_MEMORY": "1g",
                "HYBRIDFLOW_SPARK_CONF": json.dumps(
                    {"spark.executor.extraJavaOptions": spec.java_options}
                ),
            },
            validated,
            duck_dir,
            version,
        )
    finally:
        stop_cluster(records)
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    common = {"events": events, "customers": customers, "cores": CORES, "load": os.getloadavg()[0]}
    for name, measured in arms.items():
        for i, run in enumerate(("first", "second")):
            new, old = measured["features"][i], measured["spark_sql"][i]
            rows.append(
                {
                    "benchmark": f"cluster features, {name} ({run} run)",
                    "subject": "unclustered events on S3: one shuffle by customer, DuckDB per "
                    f"partition ({measured['checks']['engine'][0]})",
                    "baseline": f"one DuckDB process, {CORES} threads, same outputs",
                    "ratio": duck_s / new,
                    **common,
                    "seconds": new,
                    "duckdb_s": duck_s,
                    "cpu_ratio": duck_cpu / measured["features_cpu"][i],
                    "cpu_s": measured["features_cpu"][i],
                    "duckdb_cpu_s": duck_cpu,
                    "before_spark_sql_s": old,
                    "before_ratio": duck_s / old,
                    "max_rel_diff": measured["checks"]["max_rel_diff"],
                }
            )
            scored = measured["inference"][i]
            rows.append(
                {
                    "benchmark": f"cluster batch inference, {name} ({run} run)",
                    "subject": "the stage on the executors: a task per file, S3 -> torch -> S3",
                    "baseline": f"torch in memory, {CORES} threads",
                    "ratio": torch_s / scored,
                    "rows": inference_rows,
                    "seconds": scored,
                    "torch_s": torch_s,
                    "cpu_ratio": torch_cpu / measured["inference_cpu"][i],
                    "cpu_s": measured["inference_cpu"][i],
                    "torch_cpu_s": torch_cpu,
                    "rows_scored": measured["checks"]["scored"],
                    "load": common["load"],
                }
            )
    return rows
