"""The batch-inference stage: score every customer's features at T with a registry version."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa
from pyspark import Accumulator
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, DoubleType, StringType, StructField, StructType

from infra.datasets import find_dataset
from infra.errors import HybridflowInputError
from infra.layout import predictions_prefix, scoring_features_prefix
from infra.registry import ModelRegistry
from infra.spark_connect import default_parallelism
from infra.store import ObjectStore
from tasks.ml.scoring_worker import (
    PREDICTION_COLUMNS,
    ScoringModel,
    feature_matrix,
    prediction_batch,
    torch_threads_per_task,
    worker_model,
)
from tasks.stages.progress import ProgressReporter, ProgressSink, SparkRowProgress, spark_counter
from tasks.stages.records import InferenceResult, StageReport
from tasks.stages.spark_io import read_dataset, write_dataset

log = logging.getLogger(__name__)
PREDICTION_SCHEMA = StructType(
    [
        StructField(name, dtype, False)
        for name, dtype in zip(
            PREDICTION_COLUMNS, (StringType(), DoubleType(), StringType(), DateType()), strict=True
        )
    ]
)
READ_SPLITS_PER_CORE = 4


def resolve_model_version(registry: ModelRegistry, model_version: str | None) -> str:
    """The requested version, or the one ``production`` points at."""
    if model_version:
        return model_version
    production = registry.alias()
    if production is None:
        raise HybridflowInputError("no production model yet: train one first (hybridflow run)")
    return production.version


def load_scoring_model(store: ObjectStore, model_version: str | None) -> ScoringModel:
    """The version's bundle bytes, verified against the registry manifest's sha256s."""
    registry = ModelRegistry(store)
    version = resolve_model_version(registry, model_version)
    manifest, files = registry.read_files(version)
    return ScoringModel(
        version=version, files=files, sha256=dict(manifest.files), features=manifest.features
    )


def score_features(
    features: DataFrame,
    model: ScoringModel,
    as_of: dt.date,
    *,
    torch_threads: int = 1,
    rows_done: Accumulator[int] | None = None,
    model_loads: Accumulator[int] | None = None,
) -> DataFrame:
    """Predictions per the contract for every row of ``features`` (customer_id + raw features).

    ``rows_done`` / ``model_loads``: optional accumulators the workers add scored rows and model
    loads to (progress reporting, and proof that each worker loads the model once).
    """
    missing = [f for f in model.features if f not in features.columns]
    if "customer_id" not in features.columns:
        missing.insert(0, "customer_id")
    if missing:
        raise ValueError(f"features for scoring lack column(s) the model needs: {missing}")
    feature_order = list(model.features)
    version = model.version

    def score_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import torch

        from tasks.ml.model import predict_proba

        torch.set_num_threads(torch_threads)
        loaded, fresh = worker_model(model)
        if fresh and model_loads is not None:
            model_loads.add(1)
        for batch in batches:
            scores = predict_proba(loaded, feature_matrix(batch, feature_order))
            if rows_done is not None:
                rows_done.add(batch.num_rows)
            yield prediction_batch(batch.column("customer_id"), scores, version, as_of)

    selected = features.select(
        F.col("customer_id").cast("string"), *[F.col(f).cast("double") for f in feature_order]
    )
    return selected.mapInArrow(score_batches, schema=PREDICTION_SCHEMA)


@contextmanager
def _read_splits(spark: SparkSession, per_core: int) -> Iterator[None]:
    """Split the features read into about ``per_core`` tasks per core while the job is planned
    (default: one per core, which packs small files together): progress moves per finished task
    and a slow task holds up less. Restores the session's setting afterwards."""
    key = "spark.sql.files.minPartitionNum"
    previous = spark.conf.get(key, None)
    spark.conf.set(key, str(per_core * default_parallelism(spark)))
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


def batch_inference_stage(
    spark: SparkSession,
    store: ObjectStore,
    as_of: dt.date,
    model_version: str | None = None,
    *,
    progress_interval_s: float = 5.0,
    progress_sink: ProgressSink | None = None,
) -> InferenceResult:
    """Score the published features for ``as_of`` and publish predictions atomically.

    Rows scored are reported while the Spark job runs: log lines, and ``progress_sink`` (the
    flow's Prefect progress artifact ``progress-batch-inference``).
    """
    started = time.perf_counter()
    model = load_scoring_model(store, model_version)
    prefix = scoring_features_prefix(as_of)
    published = find_dataset(store, prefix)
    if published is None:
        raise HybridflowInputError(
            f"no features published for as_of {as_of}: run the features stage for that date first"
        )
    features = read_dataset(spark, store, prefix)
    threads = torch_threads_per_task(spark.conf.get("spark.task.cpus", "1"))
    loads = spark_counter(spark)  # None on Spark Connect: loads are not counted there
    reporter = ProgressReporter(
        "batch_inference",
        total=published.rows,
        min_interval_s=progress_interval_s,
        logger=log,
        sink=progress_sink,
    )
    with SparkRowProgress(spark, reporter) as progress, _read_splits(spark, READ_SPLITS_PER_CORE):
        scored = score_features(
            features,
            model,
            as_of,
            torch_threads=threads,
            rows_done=progress.rows,
            model_loads=loads,
        )
        out = write_dataset(
            scored, store, predictions_prefix(as_of), metadata={"model_version": model.version}
        )
    seconds = time.perf_counter() - started
    log.info(
        "scored %s customers with %s in %.1fs (%s rows/s, %s model load(s), %d torch thread(s) "
        "per task)",
        f"{out.rows:,}",
        model.version,
        seconds,
        f"{out.rows / seconds:,.0f}",
        "uncounted" if loads is None else loads.value,
        threads,
    )
    return InferenceResult(
        report=StageReport(
            name="batch_inference", seconds=seconds, rows_in=published.rows, rows_out=out.rows
        ),
        model_version=model.version,
        predictions_prefix=out.prefix,
        predictions_uri=store.key_uri(out.data_prefix),
        rows_scored=out.rows,
        model_loads=None if loads is None else loads.value,
        torch_threads=threads,
    )
