"""Each engine's implementation of each stage's protocol, by the engine name
:func:`tasks.data.engine_choice.choose_engine` gives: the one place a runner's choice becomes an
implementation. An engine is a folder of implementations (``in_process/``, ``spark/``) and its
lines here; the runners do not name engines' classes."""

from __future__ import annotations

from pyspark.sql import SparkSession

from infra.compute.spark import SessionProvider, local_cores, session_of
from infra.compute.spark_io import EVENTS_KEY, customer_clustered_files
from infra.storage.datasets import read_dataset_manifest
from infra.storage.store import ObjectStore
from tasks.data.engine_choice import IN_PROCESS, SPARK_PER_BUCKET, Engine
from tasks.engines.drift_aggregator import DriftAggregator
from tasks.engines.feature_frame import FeatureFrame, FeatureOutput
from tasks.engines.in_process.drift import InProcessDriftAggregator
from tasks.engines.in_process.features import InProcessFeatureFrame
from tasks.engines.in_process.scoring import InProcessScorer
from tasks.engines.in_process.snapshot import InProcessSnapshotBuilder
from tasks.engines.in_process.validate import InProcessValidator
from tasks.engines.scorer import Scorer
from tasks.engines.snapshot_builder import SnapshotBuilder
from tasks.engines.spark.drift import SparkDriftAggregator
from tasks.engines.spark.features import SparkFeatureFrame
from tasks.engines.spark.features_per_bucket import BucketFeatureFrame
from tasks.engines.spark.scoring import SparkScorer
from tasks.engines.spark.snapshot import SparkSnapshotBuilder
from tasks.engines.spark.validate import SparkValidator
from tasks.engines.validator import Validator

Spark = SparkSession | SessionProvider


def validator(engine: Engine, spark: Spark) -> Validator:
    """The validate stage on ``engine`` (Spark's session started only when it validates)."""
    if engine == IN_PROCESS:
        return InProcessValidator()
    return SparkValidator(spark)


def feature_frame(
    engine: Engine,
    spark: Spark,
    store: ObjectStore,
    events_prefix: str,
    outputs: list[FeatureOutput],
    available: set[str],
    sequence_length: int = 0,
) -> FeatureFrame:
    """The features stage on ``engine``: DuckDB in this process; a Spark task per bucket of
    events clustered by customer, each running DuckDB; Spark SQL."""
    if engine == IN_PROCESS:
        return InProcessFeatureFrame(store, events_prefix, outputs, available, sequence_length)
    session = session_of(spark)
    if engine == SPARK_PER_BUCKET:
        buckets = customer_clustered_files(read_dataset_manifest(store, events_prefix), EVENTS_KEY)
        assert buckets is not None  # what the choice saw
        return BucketFeatureFrame(session, store, buckets, outputs, available, sequence_length)
    return SparkFeatureFrame(session, store, events_prefix, outputs, available, sequence_length)


def snapshot_builder(engine: Engine, spark: Spark) -> SnapshotBuilder:
    """The preprocess stage on ``engine`` (Spark's session started at its first publication)."""
    if engine == IN_PROCESS:
        return InProcessSnapshotBuilder()
    return SparkSnapshotBuilder(spark)


def drift_aggregator(engine: Engine, spark: SessionProvider) -> DriftAggregator:
    """The drift check on ``engine`` (Spark's session started when it aggregates)."""
    if engine == IN_PROCESS:
        return InProcessDriftAggregator()
    return SparkDriftAggregator(spark)


def scorer(
    engine: Engine, spark: Spark, *, torch_threads: int, batch_rows: int, in_process_rows: int
) -> Scorer:
    """Batch inference on ``engine``: a thread per local core in this process, or Spark tasks
    of ``torch_threads`` each (its session started when it scores)."""
    if engine == IN_PROCESS:
        return InProcessScorer(local_cores(spark) or 1, batch_rows)
    return SparkScorer(spark, torch_threads, batch_rows, in_process_rows)
