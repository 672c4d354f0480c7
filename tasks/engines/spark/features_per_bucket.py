"""The features stage on Spark for events clustered by customer: one Spark task per bucket.

The events validate publishes are hash-bucketed by customer, so a bucket holds every event of
its customers and its features need no other bucket. Spark runs one task per bucket (a cluster
spreads them over its executors); each task reads its bucket's files straight from the store,
computes its customers' features at every cutoff with DuckDB and puts one part file per output
into the store (:mod:`tasks.engines.spark.feature_parts`); the driver publishes each output from those
parts.

Against Spark SQL over the same buckets, this is one job instead of four and a vectorised
engine instead of a row-at-a-time aggregate over 240 conditional aggregates
(``docs/benchmarks.md``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession

from infra.compute.duckdb_session import task_memory_limit
from infra.compute.executor_io import executor_store
from infra.compute.spark import conf_value
from infra.compute.spark_io import SparkJobs, check_cluster_sees
from infra.storage.store import ObjectStore
from tasks.data.cutoffs import Cutoff
from tasks.engines.feature_frame import FeatureOutput
from tasks.engines.spark.customer_shuffle import is_piece, read_pieces
from tasks.engines.spark.feature_parts import (
    PART_DONE,
    PartWritten,
    Targets,
    TaskPartsFrame,
    parts_done,
    task_targets,
    write_feature_parts,
)


def bucket_features(
    store: ObjectStore,
    files: Sequence[str],
    available: set[str],
    targets: Targets,
    *,
    threads: int = 1,
    memory: str | None = None,
    sequence_length: int = 0,
) -> tuple[list[PartWritten], int]:
    """:func:`tasks.engines.spark.feature_parts.write_feature_parts` of the customers in the event
    ``files`` (all of their events: Parquet files, or the pieces of
    :mod:`tasks.engines.spark.customer_shuffle`). Runs in a Spark task's Python worker; files of
    a remote store are downloaded to a temporary folder first."""
    with tempfile.TemporaryDirectory(prefix="hybridflow-bucket-") as tmp:
        paths = []
        for i, key in enumerate(files):
            local = store.local_path(key)
            if local is None:
                local = Path(tmp) / f"events-{i}{Path(key).suffix}"
                store.get_file(key, local)
            paths.append(local)
        return write_feature_parts(
            store,
            read_pieces(paths) if paths and all(is_piece(p) for p in paths) else paths,
            available,
            targets,
            threads=threads,
            memory=memory,
            sequence_length=sequence_length,
        )


class BucketFeatureFrame(TaskPartsFrame):
    """A :class:`tasks.engines.feature_frame.FeatureFrame` computed by one Spark job of a task per
    bucket (``buckets``: each a list of event files holding all of their customers' events);
    the parts are written when the ``with`` block is entered and published by
    :meth:`publish`."""

    def __init__(
        self,
        spark: SparkSession,
        store: ObjectStore,
        buckets: list[list[str]],
        outputs: list[FeatureOutput],
        available: set[str],
        sequence_length: int = 0,
    ) -> None:
        super().__init__(store, outputs)
        self._spark = spark
        self._sequence_length = sequence_length
        self._buckets = buckets
        self._available = available

    def __enter__(self) -> BucketFeatureFrame:
        check_cluster_sees(self._spark, "the store", self._store.uri)
        super().__enter__()
        return self

    def _run(self, data_prefixes: list[str]) -> list[dict]:
        """The job: a task per bucket; what each wrote, one row per bucket and output."""
        with SparkJobs(self._spark) as jobs:
            rows = bucket_tasks(
                self._spark,
                self._store.uri,
                self._buckets,
                [o.cutoffs for o in self._outputs],
                data_prefixes,
                self._available,
                self._sequence_length,
            )
        self.spark_jobs = jobs.count
        return rows


def bucket_tasks(
    spark: SparkSession,
    store_uri: str,
    buckets: list[list[str]],
    output_cutoffs: list[tuple[Cutoff, ...]],
    data_prefixes: list[str],
    available: set[str],
    sequence_length: int = 0,
) -> list[dict]:
    """One job of a task per bucket (its event files in the store at ``store_uri``), writing
    each output's part of the bucket under the output's data folder; the
    :data:`tasks.engines.spark.feature_parts.PART_DONE` rows the tasks handed back (part = the
    bucket's index)."""
    threads = max(1, int(conf_value(spark, "spark.task.cpus", "1")))

    def compute(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = executor_store(store_uri)
        memory = task_memory_limit(max(1, (os.cpu_count() or 1) // threads))
        for batch in batches:
            for bucket in batch.column("id").to_pylist():
                parts, after = bucket_features(
                    store,
                    buckets[bucket],
                    available,
                    task_targets(output_cutoffs, data_prefixes, bucket),
                    threads=threads,
                    memory=memory,
                    sequence_length=sequence_length,
                )
                yield parts_done(bucket, parts, after)

    if not buckets:
        return []
    n = len(buckets)
    tasks = spark.range(0, n, 1, numPartitions=n)
    return [r.asDict() for r in tasks.mapInArrow(compute, PART_DONE).collect()]
