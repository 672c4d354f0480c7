"""The features stage on Spark for events clustered by customer: one Spark task per bucket.

The events validate publishes are hash-bucketed by customer, so a bucket holds every event of
its customers and its features need no other bucket. Spark runs one task per bucket (a cluster
spreads them over its executors); each task reads its bucket's files straight from the store,
computes its customers' features at every cutoff with DuckDB (the SQL of
:mod:`tasks.data.feature_sql`, the text Spark SQL and the in-process path run) and puts one part
file per output into the store, under the output's new data folder. The driver publishes each
output from those parts; nothing is visible until then, and a failed task's parts are swept
with the unpublished generation.

Against Spark SQL over the same buckets, this is one job instead of four and a vectorised
engine instead of a row-at-a-time aggregate over 240 conditional aggregates
(``docs/benchmarks.md``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from infra.compute.duckdb_session import memory_bounded, task_memory_limit
from infra.compute.executor_io import executor_store
from infra.compute.spark import conf_value
from infra.compute.spark_io import SparkJobs, check_cluster_sees, spark_schema_metadata
from infra.storage.datasets import DatasetManifest, new_data_prefix, publish_written_dataset
from infra.storage.store import ObjectStore
from tasks.data.cutoffs import Cutoff
from tasks.data.features_duckdb import InProcessFeatures
from tasks.engines.feature_frame import FeatureOutput

TASK_REMEDY = (
    "raise HYBRIDFLOW_IN_PROCESS_MEMORY, which bounds each features task's DuckDB too (unset: "
    "40% of the machine split between the tasks running on it)"
)
# What a task hands back to the driver per output of its bucket.
PART_DONE_ARROW = pa.schema(
    [
        pa.field("bucket", pa.int64(), False),
        pa.field("output", pa.int64(), False),
        pa.field("rows", pa.int64(), False),
        pa.field("positives", pa.float64(), False),
        pa.field("events_after", pa.int64(), False),
        pa.field("schema", pa.binary(), False),
    ]
)
PART_DONE = from_arrow_schema(PART_DONE_ARROW)


@dataclass(frozen=True)
class PartWritten:
    """One output's part of one bucket: its rows, their label sum and the part's schema."""

    rows: int
    positives: float
    schema: pa.Schema


def part_key(data_prefix: str, bucket: int) -> str:
    """The store key of bucket ``bucket``'s part of an output written under ``data_prefix``."""
    return f"{data_prefix}/part-{bucket:05d}.parquet"


def bucket_features(
    store: ObjectStore,
    files: Sequence[str],
    available: set[str],
    targets: Sequence[tuple[tuple[Cutoff, ...], str]],
    *,
    threads: int = 1,
    memory: str | None = None,
    sequence_length: int = 0,
) -> tuple[list[PartWritten], int]:
    """Compute the features of the customers in the event ``files`` (all of their events) at
    each target's cutoffs (one unlabelled cutoff, or labelled origins: training examples) with
    DuckDB and put each as a Parquet file at the target's key.

    Returns each target's part and the events after the latest cutoff. Runs in a Spark task's
    Python worker; files of a remote store are downloaded to a temporary folder first.
    """
    with tempfile.TemporaryDirectory(prefix="hybridflow-bucket-") as tmp:
        paths = []
        for i, key in enumerate(files):
            local = store.local_path(key)
            if local is None:
                local = Path(tmp) / f"events-{i}.parquet"
                store.get_file(key, local)
            paths.append(local)
        cutoffs = list({c.name: c for cs, _ in targets for c in cs}.values())
        parts = []
        with (
            memory_bounded("a features task", memory, TASK_REMEDY),
            InProcessFeatures(
                paths,
                cutoffs,
                available,
                threads=threads,
                memory=memory,
                sequence_length=sequence_length,
            ) as table,
        ):
            for target, key in targets:
                rows = table.output_table(target)
                sink = pa.BufferOutputStream()
                pq.write_table(rows, sink)
                store.put_bytes(key, sink.getvalue().to_pybytes())
                positives = (
                    float(pc.sum(rows["label"]).as_py() or 0.0)
                    if target[0].label_until is not None
                    else 0.0
                )
                parts.append(PartWritten(rows.num_rows, positives, rows.schema))
            after = table.events_after()
    return parts, after


@dataclass
class _Published:
    data_prefix: str
    keys: list[str]
    rows: int
    positives: float
    schema: pa.Schema | None


class BucketFeatureFrame:
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
        self._spark = spark
        self._sequence_length = sequence_length
        self._store = store
        self._buckets = buckets
        self._outputs = outputs
        self._available = available
        self._parts: dict[FeatureOutput, _Published] = {}
        self._events_after = 0
        self.spark_jobs: int | None = None

    def __enter__(self) -> BucketFeatureFrame:
        check_cluster_sees(self._spark, "the store", self._store.uri)
        published = [_Published(new_data_prefix(o.prefix), [], 0, 0.0, None) for o in self._outputs]
        done = self._run([p.data_prefix for p in published])
        for row in done:
            out = published[row["output"]]
            out.keys.append(part_key(out.data_prefix, row["bucket"]))
            out.rows += row["rows"]
            out.positives += row["positives"]
            out.schema = out.schema or pa.ipc.read_schema(pa.py_buffer(row["schema"]))
        # every output's row of a bucket carries the bucket's count: take the first output's
        self._events_after = sum(row["events_after"] for row in done if row["output"] == 0)
        self._parts = dict(zip(self._outputs, published, strict=True))
        return self

    def _run(self, data_prefixes: list[str]) -> list[dict]:
        """The job: a task per bucket; what each wrote, one row per bucket and output."""
        store_uri = self._store.uri
        buckets, available, sequence_length = self._buckets, self._available, self._sequence_length
        output_cutoffs = [o.cutoffs for o in self._outputs]
        threads = max(1, int(conf_value(self._spark, "spark.task.cpus", "1")))

        def compute(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            store = executor_store(store_uri)
            memory = task_memory_limit(max(1, (os.cpu_count() or 1) // threads))
            for batch in batches:
                for bucket in batch.column("id").to_pylist():
                    targets = [
                        (cutoffs, part_key(prefix, bucket))
                        for cutoffs, prefix in zip(output_cutoffs, data_prefixes, strict=True)
                    ]
                    parts, after = bucket_features(
                        store,
                        buckets[bucket],
                        available,
                        targets,
                        threads=threads,
                        memory=memory,
                        sequence_length=sequence_length,
                    )
                    yield pa.RecordBatch.from_pylist(
                        [
                            {
                                "bucket": bucket,
                                "output": i,
                                "rows": part.rows,
                                "positives": part.positives,
                                "events_after": after,
                                "schema": part.schema.serialize().to_pybytes(),
                            }
                            for i, part in enumerate(parts)
                        ],
                        schema=PART_DONE_ARROW,
                    )

        n = len(buckets)
        with SparkJobs(self._spark) as jobs:
            tasks = self._spark.range(0, n, 1, numPartitions=n)
            rows = [r.asDict() for r in tasks.mapInArrow(compute, PART_DONE).collect()]
        self.spark_jobs = jobs.count
        return rows

    def __exit__(self, *exc: object) -> None:
        self._parts = {}

    def publish(self, output: FeatureOutput) -> tuple[DatasetManifest, float]:
        """Publish the output's parts as its dataset; with its label rate (0.0 when
        unlabelled)."""
        if output not in self._parts:
            raise RuntimeError(f"no parts for {output.prefix}: use the frame inside its block")
        part = self._parts[output]
        manifest = publish_written_dataset(
            self._store,
            output.prefix,
            part.data_prefix,
            part.keys,
            rows=part.rows,
            metadata={
                **(spark_schema_metadata(part.schema) if part.schema is not None else {}),
                **output.metadata(),
            },
        )
        rate = part.positives / part.rows if part.rows and output.labelled else 0.0
        return manifest, rate

    def events_after(self) -> int:
        """Events after the latest cutoff, summed over the buckets."""
        return self._events_after
