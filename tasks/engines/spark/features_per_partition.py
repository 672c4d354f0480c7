"""The features stage on Spark for events that are not clustered by customer (an S3 store on a
cluster, whose executors write the events without a bucket layout): one shuffle by customer,
then a task per partition running the feature SQL in DuckDB.

Spark hash-partitions the events by ``customer_id`` (one shuffle; a customer's events all land
in one partition, whatever files they came from) and hands each partition's rows to a Python
worker as Arrow record batches (``mapInArrow``, ``spark.sql.execution.arrow.maxRecordsPerBatch``
rows at a time). The worker streams them into DuckDB's memory-bounded storage (never the whole
partition in Arrow), computes its customers' features at every cutoff with the SQL the
in-process path and the task per bucket run, and puts one part file per output into the store
(:mod:`tasks.engines.spark.feature_parts`); the driver publishes the parts. The partitions are sized as
validate sizes its buckets (:func:`infra.compute.spark_io.bucket_count`: one for a small input, else a
multiple of the cores with at most about 4M events each).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import SparkSession

from infra.compute.duckdb_session import task_memory_limit
from infra.compute.executor_io import executor_store
from infra.compute.spark import conf_value
from infra.compute.spark_io import SparkJobs, bucket_count, read_dataset
from infra.storage.datasets import read_dataset_manifest
from infra.storage.store import ObjectStore
from tasks.data.features_duckdb import EVENT_COLUMNS
from tasks.engines.feature_frame import FeatureOutput
from tasks.engines.spark.feature_parts import (
    PART_DONE,
    Targets,
    TaskPartsFrame,
    parts_done,
    task_targets,
    write_feature_parts,
)

CUSTOMER = "customer_id"


def partition_features(
    batches: Iterator[pa.RecordBatch],
    part: int,
    store: ObjectStore,
    available: set[str],
    targets: Targets,
    *,
    threads: int = 1,
    memory: str | None = None,
    sequence_length: int = 0,
) -> Iterator[pa.RecordBatch]:
    """One partition's work (every event of its customers, as record batches): its parts
    written, and the :data:`tasks.engines.spark.feature_parts.PART_DONE` rows saying so; nothing for
    an empty partition (it has no customers)."""
    first = next(batches, None)
    if first is None:
        return
    reader = pa.RecordBatchReader.from_batches(first.schema, itertools.chain([first], batches))
    parts, after = write_feature_parts(
        store,
        reader,
        available,
        targets,
        threads=threads,
        memory=memory,
        sequence_length=sequence_length,
    )
    yield parts_done(part, parts, after)


class PartitionFeatureFrame(TaskPartsFrame):
    """A :class:`tasks.engines.feature_frame.FeatureFrame` computed by one Spark job: the events
    at ``events_prefix`` shuffled by customer, a task per partition."""

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
        """How many partitions the events are shuffled into (tasks of the job)."""
        rows = read_dataset_manifest(self._store, self._events_prefix).rows
        return bucket_count(self._spark, rows)

    def _run(self, data_prefixes: list[str]) -> list[dict]:
        """The job: read, shuffle by customer, a task per partition; what each wrote."""
        store_uri = self._store.uri
        available, sequence_length = self._available, self._sequence_length
        output_cutoffs = [o.cutoffs for o in self._outputs]
        threads = max(1, int(conf_value(self._spark, "spark.task.cpus", "1")))

        def compute(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            from pyspark import TaskContext

            part = TaskContext.get().partitionId()
            yield from partition_features(
                batches,
                part,
                executor_store(store_uri),
                available,
                task_targets(output_cutoffs, data_prefixes, part),
                threads=threads,
                memory=task_memory_limit(max(1, (os.cpu_count() or 1) // threads)),
                sequence_length=sequence_length,
            )

        with SparkJobs(self._spark) as jobs:
            events = read_dataset(self._spark, self._store, self._events_prefix)
            shuffled = events.select(*EVENT_COLUMNS).repartition(self.partitions(), CUSTOMER)
            rows = [r.asDict() for r in shuffled.mapInArrow(compute, PART_DONE).collect()]
        self.spark_jobs = jobs.count
        return rows
