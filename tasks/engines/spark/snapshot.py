"""The preprocess stage's snapshot on Spark: the examples split by customer by the split's SQL
(:func:`tasks.data.split.assign_split`), written partitioned by split by one job that observes
the split counts, the normaliser's statistics and the non-finite values on the way."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

from infra.compute.spark import SessionProvider, session_of
from infra.compute.spark_io import SparkJobs, read_dataset, write_observed
from infra.storage.datasets import DatasetManifest
from infra.storage.store import ObjectStore
from tasks.data.split import (
    assign_split,
    non_finite_aggregates,
    normalizer_aggregates,
    split_count_columns,
)
from tasks.definitions.examples import ORIGIN, sequence_columns
from tasks.engines.snapshot_builder import Metadata


class SparkSnapshotBuilder:
    """The preprocess stage's :class:`~tasks.engines.snapshot_builder.SnapshotBuilder` on
    Spark (the session is started at the first publication)."""

    def __init__(self, spark: SparkSession | SessionProvider) -> None:
        self._spark = spark
        self.spark_jobs: int | None = 0

    def publish(
        self,
        store: ObjectStore,
        examples: DatasetManifest,
        out_prefix: str,
        features: list[str],
        seed: int,
        metadata: Metadata,
    ) -> tuple[DatasetManifest, dict[str, Any]]:
        spark = session_of(self._spark)
        with SparkJobs(spark) as jobs:
            with_split = assign_split(read_dataset(spark, store, examples.prefix), seed)
            carried = [ORIGIN, *sequence_columns(with_split.columns)]
            published = write_observed(
                with_split.select("customer_id", "label", *features, *carried, "split"),
                store,
                out_prefix,
                [
                    *split_count_columns(),
                    *normalizer_aggregates(features),
                    *non_finite_aggregates(features),
                ],
                partition_by=["split"],
                metadata=metadata,
            )
        self.spark_jobs = (
            None if jobs.count is None or self.spark_jobs is None else self.spark_jobs + jobs.count
        )
        return published
