"""The features stage on Spark SQL, for events not clustered by customer: the customer-level
table of every cutoff computed once (:func:`tasks.data.features.customer_features_at`, the SQL
of :mod:`tasks.data.feature_sql`), kept in memory (then disk) while each output is published."""

from __future__ import annotations

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from infra.compute.spark_io import SparkJobs, read_dataset, write_dataset, write_observed
from infra.storage.datasets import DatasetManifest
from infra.storage.store import ObjectStore
from tasks.data.features import customer_features_at, cutoff_features, examples_features
from tasks.engines.feature_frame import FeatureOutput, distinct_cutoffs


class SparkFeatureFrame:
    """The customer-level table of the outputs' cutoffs computed by Spark SQL and kept in
    memory (then disk) inside the ``with`` block; ``spark_jobs`` counts the block's jobs once
    it is left."""

    def __init__(
        self,
        spark: SparkSession,
        store: ObjectStore,
        events_prefix: str,
        outputs: list[FeatureOutput],
        available: set[str],
        sequence_length: int = 0,
    ) -> None:
        self._spark = spark
        self._sequence_length = sequence_length
        self._jobs = SparkJobs(spark)
        self._store = store
        self._events_prefix = events_prefix
        self._cutoffs = distinct_cutoffs(outputs)
        self._available = available
        self._wide: DataFrame | None = None
        self.spark_jobs: int | None = None

    def __enter__(self) -> SparkFeatureFrame:
        self._jobs.__enter__()
        events = read_dataset(self._spark, self._store, self._events_prefix)
        wide = customer_features_at(events, self._cutoffs, self._available, self._sequence_length)
        self._wide = wide.persist(StorageLevel.MEMORY_AND_DISK)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._wide is not None:
            self._wide.unpersist()
        self._jobs.__exit__(*exc)
        self.spark_jobs = self._jobs.count

    def _frame(self) -> DataFrame:
        if self._wide is None:
            raise RuntimeError("use the frame inside its with block")
        return self._wide

    def publish(self, output: FeatureOutput) -> tuple[DatasetManifest, float]:
        """Write the customers seen at the output's cutoff; their label rate (0.0 when
        unlabelled) is observed by the write."""
        n = self._sequence_length
        if not output.labelled:
            rows = cutoff_features(self._frame(), output.cutoffs[0], self._available, n)
            return write_dataset(rows, self._store, output.prefix, metadata=output.metadata()), 0.0
        rows = examples_features(self._frame(), output.cutoffs, self._available, n)
        examples, observed = write_observed(
            rows,
            self._store,
            output.prefix,
            [F.sum("label").alias("positives")],
            metadata=output.metadata(),
        )
        rate = float(observed["positives"]) / examples.rows if examples.rows else 0.0
        return examples, rate

    def events_after(self) -> int:
        """Events after the latest cutoff, summed over the customers in memory."""
        row = self._frame().agg(F.sum("events_after").alias("n")).first()
        return int(row["n"] or 0) if row else 0
