"""The features stage on Spark for events that are not clustered by customer (an S3 store on a
cluster, whose executors write the events without a bucket layout): one shuffle by customer,
then a task per partition running the feature SQL in DuckDB.

The shuffle goes through the store (:mod:`tasks.engines.spark.customer_shuffle`): a job of a task
per events file splits its rows by a hash of ``customer_id`` into the partitions and puts a
Parquet piece per partition into the store, so that a partition's pieces hold every event of its
customers, whatever files they came from. A second job runs a task per partition exactly as the
task per bucket does on validate's buckets (:mod:`tasks.engines.spark.features_per_bucket`):
DuckDB reads the partition's pieces, computes its customers' features at every cutoff with the
SQL the in-process path runs and puts one part file per output into the store
(:mod:`tasks.engines.spark.feature_parts`); the driver publishes the parts. The pieces live in
the first output's unpublished generation folder and are deleted once the parts are written (a
run that dies leaves them to that generation's sweep).

No event passes between the JVM and Python: Spark's own shuffle (``repartition`` then
``mapInArrow``, this path until 3 Dec 2026) converts every event from Arrow to the JVM's rows and
back, which on the two-worker cluster took longer than the feature SQL itself (docs/benchmarks.md
"The cluster path at engine speed" has the breakdown). The partitions are sized as
validate sizes its buckets (:func:`infra.compute.spark_io.bucket_count`: one for a small input,
else a multiple of the cores with at most about 4M events each).
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from infra.compute.spark import conf_value
from infra.compute.spark_io import SparkJobs, bucket_count
from infra.storage.datasets import read_dataset_manifest
from infra.storage.store import ObjectStore
from tasks.engines.feature_frame import FeatureOutput
from tasks.engines.spark.customer_shuffle import shuffle_by_customer
from tasks.engines.spark.feature_parts import TaskPartsFrame
from tasks.engines.spark.features_per_bucket import bucket_tasks

PIECES_FOLDER = "_by-customer"  # under the first output's new data folder, never published


class PartitionFeatureFrame(TaskPartsFrame):
    """A :class:`tasks.engines.feature_frame.FeatureFrame` computed by two Spark jobs: the
    events at ``events_prefix`` shuffled by customer through the store, then a task per
    partition."""

    def __init__(
        self,
        spark: SparkSession,
        store: ObjectStore,
        events_prefix: str,
        outputs: list[FeatureOutput],
        available: set[str],
        sequence_length: int = 0,
    ) -> None:
        super().__init__(store, outputs)
        self._spark = spark
        self._events_prefix = events_prefix
        self._available = available
        self._sequence_length = sequence_length

    def partitions(self) -> int:
        """How many partitions the events are shuffled into (tasks of the second job)."""
        rows = read_dataset_manifest(self._store, self._events_prefix).rows
        return bucket_count(self._spark, rows)

    def _run(self, data_prefixes: list[str]) -> list[dict]:
        """The jobs: the shuffle, then a task per partition; what each partition wrote."""
        pieces = f"{data_prefixes[0]}/{PIECES_FOLDER}"
        threads = max(1, int(conf_value(self._spark, "spark.task.cpus", "1")))
        with SparkJobs(self._spark) as jobs:
            try:
                partitions = shuffle_by_customer(
                    self._spark,
                    self._store,
                    self._events_prefix,
                    self.partitions(),
                    pieces,
                    slots_per_core=1 / threads,
                )
                rows = bucket_tasks(
                    self._spark,
                    self._store.uri,
                    partitions,
                    [o.cutoffs for o in self._outputs],
                    data_prefixes,
                    self._available,
                    self._sequence_length,
                )
            finally:
                jobs.wait_for_tasks()  # a failed job's other tasks may still write pieces
                self._store.delete_prefix(pieces)
        self.spark_jobs = jobs.count
        return rows
