"""The batch-inference stage: score every customer's features at T with a registry version.

The engine is chosen once (:mod:`tasks.data.engine_choice`): Spark schedules the work, one task
per ~250k rows of files of the published features (:mod:`tasks.engines.spark.scoring`), or, in
local mode for up to ``in_process_rows`` rows, a thread per core scores them in this process
(:mod:`tasks.engines.in_process.scoring`). Each reads files from the store with pyarrow, scores
them with torch and puts their predictions files back into the store
(:mod:`tasks.ml.scoring_worker`); the stage publishes those files as one dataset.
"""

from __future__ import annotations

import datetime as dt
import logging
import time

from pyspark.sql import SparkSession

from infra.compute.spark import SessionProvider, conf_value, local_cores
from infra.errors import HybridflowInputError
from infra.layout import predictions_prefix
from infra.progress import ProgressReporter, ProgressSink
from infra.settings import in_process_rows_or_default
from infra.storage.datasets import publish_written_dataset
from infra.storage.snapshots import scoring_features_for
from infra.storage.store import ObjectStore
from tasks.data.engine_choice import EngineInputs, choose_engine
from tasks.engines import registry as engines
from tasks.ml.scoring_model import load_scoring_model
from tasks.ml.scoring_worker import SCORING_BATCH_ROWS, torch_threads_per_task
from tasks.reporting.records import FeaturesResult, InferenceResult, StageReport

log = logging.getLogger(__name__)
# HYBRIDFLOW_SPARK_ARROW_BATCH_SIZE: rows a scoring task holds at once (infra/compute/spark.py sets it)
ARROW_BATCH_KEY = "spark.sql.execution.arrow.maxRecordsPerBatch"


def _log_scored(rows: int, version: str, seconds: float, loads: int | None, threads: int) -> None:
    log.info(
        "scored %s customers with %s in %.1fs (%s rows/s, %s model load(s), %d torch thread(s) "
        "per task)",
        f"{rows:,}",
        version,
        seconds,
        f"{rows / seconds:,.0f}",
        "uncounted" if loads is None else loads,
        threads,
    )


def scoring_as_of(as_of: dt.date | None, features: FeaturesResult | None = None) -> dt.date:
    """The T batch inference scores at: inside a run, the one its features stage resolved;
    else ``as_of``, which is then required."""
    if features is not None:
        return features.as_of
    if as_of is None:
        raise HybridflowInputError("batch inference needs as_of (or the run_id of a features run)")
    return as_of


def batch_inference_stage(
    spark: SparkSession | SessionProvider,
    store: ObjectStore,
    as_of: dt.date | None,
    model_version: str | None = None,
    *,
    features: FeaturesResult | None = None,
    progress_interval_s: float = 5.0,
    progress_sink: ProgressSink | None = None,
    in_process_rows: int | None = None,
) -> InferenceResult:
    """Score the published features for ``as_of`` (inside a run: T and the scoring features of
    its ``features`` stage; else the most recently published of that date) and publish
    predictions atomically; in local mode up to ``in_process_rows`` rows (default: the setting)
    in this process, without starting Spark.

    Rows scored are reported while the scoring runs: log lines, and ``progress_sink`` (the
    flow's Prefect progress artifact ``progress-batch-inference``).
    """
    started = time.perf_counter()
    as_of = scoring_as_of(as_of, features)
    model = load_scoring_model(store, model_version)
    published = scoring_features_for(store, as_of, features.scoring_prefix if features else None)
    if published is None:
        raise HybridflowInputError(
            f"no features published for as_of {as_of}: run the features stage for that date first"
        )
    limit = in_process_rows_or_default(in_process_rows)
    threads = torch_threads_per_task(conf_value(spark, "spark.task.cpus", "1"))
    batch_rows = int(conf_value(spark, ARROW_BATCH_KEY, str(SCORING_BATCH_ROWS)))
    reporter = ProgressReporter(
        "batch_inference",
        total=published.rows,
        min_interval_s=progress_interval_s,
        logger=log,
        sink=progress_sink,
    )
    target = predictions_prefix(as_of)
    cluster = local_cores(spark) is None
    choice = choose_engine(
        "batch_inference", EngineInputs(rows=published.rows, limit=limit, cluster=cluster)
    )
    log.info("batch_inference: %s (%s)", choice.engine, choice.reason)
    scorer = engines.scorer(
        choice.engine, spark, torch_threads=threads, batch_rows=batch_rows, in_process_rows=limit
    )
    scored = scorer.score(store, published, model, as_of, target, reporter)
    out = publish_written_dataset(
        store,
        target,
        scored.data_prefix,
        scored.keys,
        rows=scored.rows,
        metadata={"model_version": model.version},
    )
    seconds = time.perf_counter() - started
    _log_scored(out.rows, model.version, seconds, scored.model_loads, threads)
    return InferenceResult(
        report=StageReport(
            name="batch_inference",
            seconds=seconds,
            rows_in=published.rows,
            rows_out=out.rows,
            spark_jobs=scored.spark_jobs,
        ).with_engine(choice),
        model_version=model.version,
        predictions_prefix=out.prefix,
        predictions_uri=store.key_uri(out.data_prefix),
        rows_scored=out.rows,
        model_loads=scored.model_loads,
        torch_threads=threads,
    )
