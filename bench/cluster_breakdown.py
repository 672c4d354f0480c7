"""Where the cluster path's time goes (``python -m bench.cluster_breakdown``): the features stage
on events not clustered by customer (``spark-per-partition``) and batch inference on the
executors, taken apart on the same set-up as ``bench cluster`` (moto S3 over HTTP, a standalone
master with two workers of one core, the driver in client mode on this machine).

Measured, each twice (the first run pays the executors' fresh Python workers):

- fixed costs: a job with no Python (``range().count()``), a job of two empty Python tasks
  (``mapInArrow``), and in a fresh Python worker the imports a features/scoring task needs;
- the store alone: the event files and the feature files downloaded from moto by this process
  and by the executors (a task per file, nothing else done);
- the events' way into the tasks, step by step: read from S3 into the JVM (``count()``), then
  also shuffled by customer and handed to Python workers as Arrow batches (drained, nothing
  computed), then the whole per-partition job with timers inside each task (waiting for
  batches, DuckDB ingest + SQL, each output's select, Parquet encode and put);
- the features stage itself (``build_features``) and batch inference (the stage);
- Spark's own account of every job (event log): wall, stages, per stage the tasks' run time,
  deserialisation, shuffle write/fetch wait, GC and the scheduler's gap (launch to finish minus
  run time).

Baselines in the same run: DuckDB with 2 threads on the same events (local Parquet), the feature
SQL with 1 thread on half the customers from an Arrow table (what one task's DuckDB does at
best), torch with 2 threads on the 1M rows in memory, and reading those rows' Parquet from the
store in this process. Prints one JSON document.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bench.bench_cluster import (
    BUCKET,
    CORES,
    EVENTS_PREFIX,
    REPO,
    _to_s3_unclustered,
    _torch_seconds,
    _valid_events,
    run_arm_process,
)
from bench.bench_features import ALL_COLUMNS, HORIZON_DAYS, duckdb_features
from bench.bench_inference import AS_OF as INFERENCE_AS_OF
from bench.bench_inference import _register_model, _write_features


def _timed(fn) -> tuple[float, object]:
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def _partition_timers(store_uri, part, batches, cutoffs, targets, available, memory):
    """The per-partition task of :mod:`tasks.engines.spark.features_per_partition` with timers."""
    import itertools

    from infra.compute.executor_io import executor_store
    from tasks.data.features_duckdb import InProcessFeatures

    started = time.perf_counter()
    waited, rows = [0.0], [0]

    def pulled():
        while True:
            t = time.perf_counter()
            batch = next(batches, None)
            waited[0] += time.perf_counter() - t
            if batch is None:
                return
            rows[0] += batch.num_rows
            yield batch

    stream = pulled()
    first = next(stream, None)
    if first is None:
        return
    first_s = time.perf_counter() - started
    reader = pa.RecordBatchReader.from_batches(first.schema, itertools.chain([first], stream))
    store = executor_store(store_uri)
    t = time.perf_counter()
    table = InProcessFeatures(reader, cutoffs, available, threads=1, memory=memory)
    build_s = time.perf_counter() - t
    select_s = encode_s = put_s = 0.0
    for target, key in targets:
        t = time.perf_counter()
        out = table.output_table(target)
        select_s += time.perf_counter() - t
        t = time.perf_counter()
        sink = pa.BufferOutputStream()
        pq.write_table(out, sink)
        data = sink.getvalue().to_pybytes()
        encode_s += time.perf_counter() - t
        t = time.perf_counter()
        store.put_bytes(key, data)
        put_s += time.perf_counter() - t
    table.close()
    yield pa.RecordBatch.from_pylist(
        [
            {
                "part": part,
                "rows": rows[0],
                "first_batch_s": first_s,
                "waiting_for_batches_s": waited[0],
                "duckdb_ingest_and_sql_s": build_s - (waited[0] - first_s),
                "select_outputs_s": select_s,
                "parquet_encode_s": encode_s,
                "put_s": put_s,
                "task_s": time.perf_counter() - started,
            }
        ]
    )


TIMER_SCHEMA = (
    "part long, rows long, first_batch_s double, waiting_for_batches_s double, "
    "duckdb_ingest_and_sql_s double, select_outputs_s double, parquet_encode_s double, "
    "put_s double, task_s double"
)


def arm(validated_json: str, version: str) -> None:
    """The client-mode driver's measurements (a child process); prints one JSON line."""
    from infra.compute.duckdb_session import task_memory_limit
    from infra.compute.spark import get_spark
    from infra.compute.spark_io import bucket_count, read_dataset
    from infra.settings import get_settings
    from infra.storage.datasets import read_dataset_manifest
    from infra.storage.store import open_store
    from tasks.data.cutoffs import Origins, pipeline_cutoffs
    from tasks.data.features_duckdb import EVENT_COLUMNS
    from tasks.reporting.records import ValidateResult
    from tasks.stages.batch_inference import batch_inference_stage
    from tasks.stages.features import build_features

    settings = get_settings()
    store = open_store(settings.store)
    uri = store.uri
    validated = ValidateResult.model_validate_json(validated_json)
    out: dict = defaultdict(list)
    out["session_s"], spark = _timed(lambda: get_spark(settings))
    sc = spark.sparkContext

    def job(name: str, fn):
        sc.setJobDescription(name)
        seconds, value = _timed(fn)
        out[name].append(seconds)
        sc.setJobDescription(None)
        return value

    def imports(_):
        started = time.perf_counter()
        import duckdb  # noqa: F401

        duck = time.perf_counter() - started
        import torch  # noqa: F401

        yield pa.RecordBatch.from_pylist(
            [{"duckdb_s": duck, "torch_s": time.perf_counter() - started - duck}]
        )

    out["python_worker_imports"] = [
        r.asDict()
        for r in job(
            "worker imports (fresh workers)",
            lambda: (
                spark.range(0, 2, 1, 2)
                .mapInArrow(imports, "duckdb_s double, torch_s double")
                .collect()
            ),
        )
    ]

    def nothing(batches):
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pylist([{"n": 0}])

    for _ in range(3):
        job("empty JVM job", lambda: spark.range(0, 2, 1, 2).count())
        job(
            "empty Python job",
            lambda: spark.range(0, 2, 1, 2).mapInArrow(nothing, "n long").collect(),
        )

    def files_of(prefix: str) -> list[str]:
        return list(read_dataset_manifest(store, prefix).files)

    def download(files: list[str]):
        def task(ids):
            from infra.compute.executor_io import executor_store

            source = executor_store(uri)
            for batch in ids:
                for i in batch.column(0).to_pylist():
                    started = time.perf_counter()
                    size = len(source.get_bytes(files[i]))
                    yield pa.RecordBatch.from_pylist(
                        [{"bytes": size, "seconds": time.perf_counter() - started}]
                    )

        return (
            spark.range(0, len(files), 1, len(files))
            .mapInArrow(task, "bytes long, seconds double")
            .collect()
        )

    from infra.layout import scoring_features_prefix

    event_files = files_of(validated.events_prefix)
    feature_files = files_of(scoring_features_prefix(INFERENCE_AS_OF))
    rows = read_dataset_manifest(store, validated.events_prefix).rows
    n = bucket_count(spark, rows)
    out["partitions"] = n
    cutoffs = pipeline_cutoffs(validated.last_event.date(), HORIZON_DAYS, Origins(count=1))
    outputs = [cutoffs.train, (cutoffs.score,), cutoffs.backtest]
    memory = task_memory_limit(1)

    def drain(batches):
        started, count, first = time.perf_counter(), 0, None
        for batch in batches:
            first = first if first is not None else time.perf_counter() - started
            count += batch.num_rows
        yield pa.RecordBatch.from_pylist(
            [{"rows": count, "first_s": first or 0.0, "s": time.perf_counter() - started}]
        )

    def per_partition(batches):
        from pyspark import TaskContext

        part = TaskContext.get().partitionId()
        targets = [
            (c, f"bench/breakdown/out-{i}/part-{part:05d}.parquet") for i, c in enumerate(outputs)
        ]
        yield from _partition_timers(
            uri,
            part,
            batches,
            list({c.name: c for cs in outputs for c in cs}.values()),
            targets,
            ALL_COLUMNS,
            memory,
        )

    for _ in ("first", "second"):
        out["executors download the event files"].append(
            [r.asDict() for r in job("download events", lambda: download(event_files))]
        )
        job(
            "read S3 -> JVM, count",
            lambda: read_dataset(spark, store, validated.events_prefix).count(),
        )
        out["read + shuffle + Arrow to Python (drained)"].append(
            [
                r.asDict()
                for r in job(
                    "read + shuffle + hand-off",
                    lambda: (
                        read_dataset(spark, store, validated.events_prefix)
                        .select(*EVENT_COLUMNS)
                        .repartition(n, "customer_id")
                        .mapInArrow(drain, "rows long, first_s double, s double")
                        .collect()
                    ),
                )
            ]
        )
        out["Spark-shuffle per-partition task timers"].append(
            [
                r.asDict()
                for r in job(
                    "Spark-shuffle per-partition job (timed; the path before the store shuffle)",
                    lambda: (
                        read_dataset(spark, store, validated.events_prefix)
                        .select(*EVENT_COLUMNS)
                        .repartition(n, "customer_id")
                        .mapInArrow(per_partition, TIMER_SCHEMA)
                        .collect()
                    ),
                )
            ]
        )

        def frame(frame_s: dict) -> None:
            from tasks.engines.feature_frame import FeatureOutput
            from tasks.engines.spark.features_per_partition import PartitionFeatureFrame

            wanted = [
                FeatureOutput(cutoffs.train, "bench/breakdown/training"),
                FeatureOutput((cutoffs.score,), "bench/breakdown/scoring"),
                FeatureOutput(cutoffs.backtest, "bench/breakdown/backtest"),
            ]
            started = time.perf_counter()
            with PartitionFeatureFrame(
                spark, store, validated.events_prefix, wanted, ALL_COLUMNS
            ) as built:
                frame_s["jobs (shuffle + a task per partition)"] = time.perf_counter() - started
                started = time.perf_counter()
                for output in wanted:
                    built.publish(output)
                frame_s["publish 3 outputs"] = time.perf_counter() - started

        parts: dict = {}
        job("store-shuffle frame", lambda parts=parts: frame(parts))
        out["store-shuffle frame parts"].append(parts)
        job(
            "features stage",
            lambda: build_features(
                spark,
                store,
                "bench",
                validated,
                validated.last_event.date(),
                HORIZON_DAYS,
                in_process_rows=0,
                origins=Origins(count=1),
            ),
        )
        out["executors download the feature files"].append(
            [r.asDict() for r in job("download features", lambda: download(feature_files))]
        )
        job(
            "batch inference stage",
            lambda: batch_inference_stage(
                spark, store, INFERENCE_AS_OF, version, progress_interval_s=60, in_process_rows=0
            ),
        )
    spark.stop()
    print("ARM " + json.dumps(out, default=str))


def event_log_summary(folder: Path) -> list[dict]:
    """Per job (by description): wall, and per stage the tasks' summed metrics (seconds)."""
    files = [f for f in folder.rglob("*") if f.is_file()]
    jobs: dict[int, dict] = {}
    stage_job: dict[int, int] = {}
    stages: dict[int, dict] = defaultdict(lambda: defaultdict(float))
    for line in files[0].read_text().splitlines():
        event = json.loads(line)
        kind = event["Event"]
        if kind == "SparkListenerJobStart":
            desc = (event.get("Properties") or {}).get("spark.job.description", "")
            jobs[event["Job ID"]] = {"job": desc, "start": event["Submission Time"], "stages": []}
            for s in event["Stage IDs"]:
                stage_job[s] = event["Job ID"]
        elif kind == "SparkListenerJobEnd":
            jobs[event["Job ID"]]["wall_s"] = (
                event["Completion Time"] - jobs[event["Job ID"]]["start"]
            ) / 1000
        elif kind == "SparkListenerTaskEnd":
            info, metrics = event["Task Info"], event.get("Task Metrics") or {}
            st = stages[event["Stage ID"]]
            st["tasks"] += 1
            span = (info["Finish Time"] - info["Launch Time"]) / 1000
            run = metrics.get("Executor Run Time", 0) / 1000
            st["task_span_s"] += span
            st["run_s"] += run
            st["cpu_s"] += metrics.get("Executor CPU Time", 0) / 1e9
            st["deserialize_s"] += metrics.get("Executor Deserialize Time", 0) / 1000
            st["gc_s"] += metrics.get("JVM GC Time", 0) / 1000
            st["launch_overhead_s"] += span - run
            write = metrics.get("Shuffle Write Metrics") or {}
            read = metrics.get("Shuffle Read Metrics") or {}
            st["shuffle_write_s"] += write.get("Shuffle Write Time", 0) / 1e9
            st["shuffle_written_mb"] += write.get("Shuffle Bytes Written", 0) / 1e6
            st["shuffle_fetch_wait_s"] += read.get("Fetch Wait Time", 0) / 1000
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            st = stages[info["Stage ID"]]
            st["name"] = info["Stage Name"].split(" at ")[0]
            if "Submission Time" in info and "Completion Time" in info:
                st["stage_wall_s"] = (info["Completion Time"] - info["Submission Time"]) / 1000
    for stage, metrics in sorted(stages.items()):
        if stage in stage_job and metrics.get("tasks"):
            jobs[stage_job[stage]]["stages"].append(
                {k: round(v, 3) if isinstance(v, float) else v for k, v in metrics.items()}
            )
    return [
        {k: v for k, v in j.items() if k != "start"} for _, j in sorted(jobs.items()) if j["job"]
    ]


def _duckdb_one_task(files: list[Path], as_of) -> float:
    """The feature SQL in DuckDB with 1 thread on half the customers, from an Arrow table."""
    import duckdb

    from tasks.data.cutoffs import Origins, pipeline_cutoffs
    from tasks.data.features_duckdb import InProcessFeatures

    table = pa.concat_tables(pq.read_table(f) for f in files)
    con = duckdb.connect()
    con.register("t", table)
    half = con.execute("SELECT * FROM t WHERE hash(customer_id) % 2 = 0").to_arrow_table()
    con.close()
    cutoffs = pipeline_cutoffs(as_of, HORIZON_DAYS, Origins(count=1))
    outputs = [cutoffs.train, (cutoffs.score,), cutoffs.backtest]
    started = time.perf_counter()
    with InProcessFeatures(
        half, list({c.name: c for cs in outputs for c in cs}.values()), ALL_COLUMNS, threads=1
    ) as features:
        for target in outputs:
            pq.write_table(features.output_table(target), io.BytesIO())
    return time.perf_counter() - started


def main() -> dict:
    import boto3

    from infra.compute.spark import QUICK_JIT_OPTIONS
    from infra.layout import scoring_features_prefix
    from infra.settings import get_settings
    from infra.stack.processes import launcher_into
    from infra.stack.spark_cluster import spark_spec, start_standalone, stop_cluster
    from infra.storage.datasets import read_dataset_manifest
    from infra.storage.store import LocalFolderStore, S3Store
    from tasks.definitions.feature_specs import feature_names
    from tests.fixtures.moto_s3 import moto_env, start_moto

    customers = int(os.environ.get("BENCH_CLUSTER_CUSTOMERS", "50000"))
    inference_rows = int(os.environ.get("BENCH_CLUSTER_INFERENCE_ROWS", "1000000"))
    work = Path(tempfile.mkdtemp(prefix="hf-cluster-breakdown-"))
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server, endpoint = start_moto()
    aws = moto_env(endpoint)
    os.environ.update(aws)
    result: dict = {"load_before": os.getloadavg()[0]}
    records: dict = {}
    try:
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        uri = f"s3://{BUCKET}/store"
        store = S3Store(uri)
        validated, files = _valid_events(work, customers)
        result["events"] = _to_s3_unclustered(store, files, work / "events")
        validated = validated.model_copy(update={"events_prefix": EVENTS_PREFIX})
        as_of = validated.last_event.date()
        duck_dir = work / "duck"
        duck_dir.mkdir()
        result["duckdb_2_threads_s"] = min(
            duckdb_features(str(work / "events" / "*.parquet"), as_of, duck_dir, threads=CORES)
            for _ in range(2)
        )
        result["duckdb_1_thread_half_customers_s"] = min(
            _duckdb_one_task(sorted((work / "events").glob("*.parquet")), as_of) for _ in range(2)
        )
        local = LocalFolderStore(work / "inference")
        features = feature_names({"event_type", "category", "channel"})
        for target in (store, local):
            _write_features(target, inference_rows, features)
        version = _register_model(store, features)
        wall, cpu = _torch_seconds(local, _register_model(local, features))
        result["torch_2_threads_s"], result["torch_2_threads_cpu_s"] = wall, cpu
        for name, prefix in (
            ("events", EVENTS_PREFIX),
            ("features", scoring_features_prefix(INFERENCE_AS_OF)),
        ):
            keys = read_dataset_manifest(store, prefix).files
            seconds, sizes = _timed(lambda keys=keys: [len(store.get_bytes(k)) for k in keys])
            decode_s, _ = _timed(
                lambda keys=keys: [pq.read_table(io.BytesIO(store.get_bytes(k))) for k in keys]
            )
            result[f"driver gets the {name} files"] = {
                "mb": sum(sizes) / 1e6,
                "seconds": seconds,
                "get_and_decode_s": decode_s,
            }
        spec = spark_spec(get_settings(), workers=2)
        launch = launcher_into(records, work / "logs", REPO)
        master_url = os.environ.get("BENCH_BREAKDOWN_MASTER")  # e.g. local[2]: a smoke test
        if master_url is None:
            # the timed tasks are this module's functions: the executors' Python imports bench
            path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
            cluster_env = dict(os.environ) | {"PYTHONPATH": path}
            master_url, _ = start_standalone(launch, work / "cluster", spec, cluster_env)
        log_dir = work / "events-log"
        log_dir.mkdir()
        conf = {
            "spark.executor.extraJavaOptions": QUICK_JIT_OPTIONS,
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": f"file://{log_dir}",
            "spark.eventLog.rolling.enabled": "false",
            "spark.eventLog.compress": "false",
        }
        env = {k: v for k, v in os.environ.items() if not k.startswith("HYBRIDFLOW_SPARK")}
        env |= {
            "HYBRIDFLOW_STORE": uri,
            "HYBRIDFLOW_WORK_DIR": str(work / "hf"),
            "HYBRIDFLOW_SPARK_MASTER": master_url,
            "HYBRIDFLOW_SPARK_EXECUTOR_MEMORY": "1g",
            "HYBRIDFLOW_SPARK_CONF": json.dumps(conf),
        }
        result["driver"] = run_arm_process(
            "bench.cluster_breakdown", [validated.model_dump_json(), version], env, "breakdown arm"
        )
        result["spark_jobs"] = event_log_summary(log_dir)
    finally:
        stop_cluster(records)
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    result["load_after"] = os.getloadavg()[0]
    return result


if __name__ == "__main__":
    from infra.prefect_runtime.env import configure_prefect_defaults

    configure_prefect_defaults()
    print(json.dumps(main(), indent=1, default=str))
