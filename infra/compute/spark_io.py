"""Moving Spark DataFrames in and out of the store as published datasets.

A write counts its rows (and any other figure the caller asks for) with an ``Observation`` in
the same job that writes the files, never by reading the output again, and records its Spark
schema in the manifest, so that reading it back needs no job to infer the schema. A dataset
written with a :class:`ClusteredLayout` (hash-bucketed by a key, each bucket one file) says so in
its manifest, and :func:`read_dataset` hands it back as a bucketed table: Spark then groups and
windows by that key without shuffling the data again.

Folder stores are read and written by Spark itself (on a cluster, only where the executors see
this machine's folders); an S3 store on a cluster goes through the executors' own store client
(:mod:`infra.compute.executor_io`), since Spark here has no ``s3a`` connector: such a dataset is written
without a declared layout (its files are still one per task).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from infra.compute.executor_io import (
    check_shared_filesystem,
    needs_executor_io,
    publish_task_outputs,
    read_on_executors,
    write_task_files,
)
from infra.compute.spark_connect import default_parallelism, is_connect, runs_on_cluster
from infra.settings import get_settings
from infra.storage.datasets import (
    DatasetManifest,
    local_dataset_dir,
    publish_dataset,
    read_dataset_manifest,
)
from infra.storage.store import ObjectStore

ROWS = "rows"
SCHEMA_KEY = "spark_schema"
ROWS_PER_BUCKET = 4_000_000
SMALL_INPUT_ROWS = 100_000
LAYOUT_KEY = "layout"
Metadata = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class ClusteredLayout:
    """Rows hash-bucketed by ``key`` into ``buckets`` files, each sorted by ``sort`` (if any).

    The DataFrame written must already be partitioned by ``key`` into ``buckets`` partitions
    (``repartition(buckets, key)`` upstream), so that every task writes exactly one bucket.
    """

    key: str
    buckets: int
    sort: tuple[str, ...] = ()

    def to_metadata(self) -> dict[str, Any]:
        """The manifest entry."""
        return {"key": self.key, "buckets": self.buckets, "sort": list(self.sort)}

    @classmethod
    def from_metadata(cls, entry: dict[str, Any] | None) -> ClusteredLayout | None:
        """The layout a manifest records, None for a plain dataset."""
        if not entry:
            return None
        return cls(key=entry["key"], buckets=int(entry["buckets"]), sort=tuple(entry["sort"]))


# The key validate clusters the published events by: a bucket holds all of a customer's events.
EVENTS_KEY = "customer_id"
# Spark's bucketed writes end each file name in ``_<bucket id>`` before the extensions
# (``part-00000-<uuid>_00003.c000.snappy.parquet``), as Spark itself reads it back.
_BUCKET_ID = re.compile(r"_(\d+)(?:\..*)?$")


def customer_clustered_files(manifest: DatasetManifest, key: str) -> list[list[str]] | None:
    """The dataset's files in groups that each hold every row of their ``key`` values: one
    group per bucket of a dataset clustered by ``key``, or the one file of a single-file
    dataset; None when the rows of a ``key`` value may lie in several groups."""
    layout = ClusteredLayout.from_metadata(manifest.metadata.get(LAYOUT_KEY))
    if layout is None or layout.key != key:
        return [list(manifest.files)] if len(manifest.files) == 1 else None
    buckets: dict[int, list[str]] = {}
    for file in manifest.files:
        found = _BUCKET_ID.search(file.rsplit("/", 1)[-1])
        if found is None:
            return None
        buckets.setdefault(int(found.group(1)), []).append(file)
    return [buckets[bucket] for bucket in sorted(buckets)]


class SparkJobs:
    """Counts the Spark jobs this thread starts inside a ``with`` block (by a job tag); the
    count stays None on Spark Connect, whose clients see no SparkContext, and is 0 without a
    session (a block that runs no Spark)."""

    def __init__(self, spark: SparkSession | None) -> None:
        self._none = spark is None
        self._sc = None if spark is None or is_connect(spark) else spark.sparkContext
        self._tag = f"hybridflow-{uuid.uuid4().hex}"
        self.count: int | None = None

    def __enter__(self) -> SparkJobs:
        if self._sc is not None:
            self._sc.addJobTag(self._tag)
        return self

    def wait_for_tasks(self, timeout_s: float = 60.0) -> None:
        """Return once no task of the jobs this block started is running: when a task fails,
        Spark fails its job at once and kills the job's other tasks afterwards, so what they
        write would land after a caller's cleanup. Nothing to wait for on Spark Connect."""
        if self._sc is None:
            return
        jobs = self._sc._jsc.sc().statusTracker().getJobIdsForTag(self._tag)
        tracker = self._sc._jsc.statusTracker()
        stages = [s for j in jobs if (job := tracker.getJobInfo(j)) for s in job.stageIds()]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(
            (stage := tracker.getStageInfo(s)) is not None and stage.numActiveTasks() > 0
            for s in stages
        ):
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        if self._sc is None:
            self.count = 0 if self._none else None
            return
        self._sc.removeJobTag(self._tag)
        tracker = self._sc._jsc.sc().statusTracker()
        self.count = len(tracker.getJobIdsForTag(self._tag))


def bucket_count(spark: SparkSession, rows: int) -> int:
    """Buckets (= tasks of every later pass) for about ``rows`` rows: one for a small input,
    else a multiple of the cores with at most about ``ROWS_PER_BUCKET`` rows each."""
    if rows <= SMALL_INPUT_ROWS:
        return 1
    cores = default_parallelism(spark)
    rounds = -(-rows // (ROWS_PER_BUCKET * cores))
    return cores * rounds


def write_observed(
    df: DataFrame,
    store: ObjectStore,
    prefix: str,
    metrics: Sequence[Column] = (),
    *,
    partition_by: list[str] | None = None,
    metadata: Metadata | None = None,
    layout: ClusteredLayout | None = None,
) -> tuple[DatasetManifest, dict[str, Any]]:
    """Write ``df`` as Parquet and publish it at ``prefix``; returns the manifest and the
    observed ``metrics`` (aggregate columns over the rows written, plus ``rows``), all from the
    one job that writes. ``metadata`` may be a function of those metrics."""
    observation = Observation()
    observed = df.observe(observation, F.count(F.lit(1)).alias(ROWS), *metrics)
    if needs_executor_io(df.sparkSession, store):
        data_prefix, written = write_task_files(observed, store, prefix, partition_by=partition_by)
        values = dict(observation.get)
        extra = _manifest_metadata(df, values, metadata, layout=None)
        manifest = publish_task_outputs(store, prefix, data_prefix, written, df.schema, extra)
        return manifest, values
    check_cluster_sees(df.sparkSession, "the store", store.uri)
    staging = store.staging_dir()
    out = staging / "data"
    try:
        if layout is None:
            writer = observed.write.mode("overwrite")
            if partition_by:
                writer = writer.partitionBy(*partition_by)
            writer.parquet(str(out))
        else:
            _write_bucketed(observed, out, layout)
        values = dict(observation.get)
        extra = _manifest_metadata(df, values, metadata, layout)
        manifest = publish_dataset(store, out, prefix, rows=int(values[ROWS]), metadata=extra)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest, values


def _manifest_metadata(
    df: DataFrame,
    values: dict[str, Any],
    metadata: Metadata | None,
    layout: ClusteredLayout | None,
) -> dict[str, Any]:
    extra = metadata(values) if callable(metadata) else dict(metadata or {})
    extra[SCHEMA_KEY] = df.schema.jsonValue()
    if layout is not None:
        extra[LAYOUT_KEY] = layout.to_metadata()
    return extra


def spark_schema_metadata(schema: pa.Schema) -> dict[str, Any]:
    """The manifest entry that lets :func:`read_dataset` read a dataset written with pyarrow
    (schema ``schema``) without a job to infer its schema."""
    return {SCHEMA_KEY: from_arrow_schema(schema).jsonValue()}


def write_dataset(
    df: DataFrame,
    store: ObjectStore,
    prefix: str,
    *,
    partition_by: list[str] | None = None,
    metadata: dict[str, Any] | None = None,
) -> DatasetManifest:
    """Write ``df`` as Parquet, counting its rows in the same job, and publish it."""
    manifest, _ = write_observed(df, store, prefix, partition_by=partition_by, metadata=metadata)
    return manifest


def _write_bucketed(df: DataFrame, out: Path, layout: ClusteredLayout) -> None:
    """``bucketBy`` needs a catalog table: a throwaway external one over ``out``."""
    spark = df.sparkSession
    table = f"hf_write_{uuid.uuid4().hex}"
    writer = df.write.bucketBy(layout.buckets, layout.key)
    if layout.sort:
        writer = writer.sortBy(*layout.sort)
    writer.format("parquet").option("path", str(out)).saveAsTable(table)
    spark.sql(f"DROP TABLE IF EXISTS {table}")  # external: the files stay


def read_dataset(spark: SparkSession, store: ObjectStore, prefix: str) -> DataFrame:
    """The published dataset at ``prefix`` as a DataFrame (downloaded first for S3); a clustered
    one as a bucketed table, so that Spark knows its layout."""
    if needs_executor_io(spark, store):
        return read_on_executors(spark, store, prefix)
    check_cluster_sees(spark, "the store", store.uri)
    manifest = read_dataset_manifest(store, prefix)
    local: Path = local_dataset_dir(store, manifest)
    recorded = manifest.metadata.get(SCHEMA_KEY)
    schema = StructType.fromJson(recorded) if recorded else None
    layout = ClusteredLayout.from_metadata(manifest.metadata.get(LAYOUT_KEY))
    if layout is not None and schema is not None:
        return _bucketed_table(spark, local, layout, schema)
    reader = spark.read.option("basePath", str(local))
    if schema is not None:
        reader = reader.schema(schema)  # no job to infer it from the files' footers
    return reader.parquet(str(local))


def check_cluster_sees(spark: SparkSession, what: str, folder: str) -> None:
    """On a cluster, refuse a local ``folder`` its executors cannot see (says what to set)."""
    if runs_on_cluster(spark):
        check_shared_filesystem(get_settings(), what, folder)


def _bucketed_table(
    spark: SparkSession, local: Path, layout: ClusteredLayout, schema: StructType
) -> DataFrame:
    """A catalog table over ``local`` that declares its buckets (registered once per folder)."""
    table = f"hf_read_{hashlib.sha256(str(local).encode()).hexdigest()[:16]}"
    if not spark.catalog.tableExists(table):
        columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in schema.fields)
        sort = ", ".join(f"`{c}`" for c in layout.sort)
        sorted_by = f"SORTED BY ({sort}) " if sort else ""
        location = str(local).replace("\\", "\\\\").replace("'", "\\'")
        spark.sql(
            f"CREATE TABLE IF NOT EXISTS {table} ({columns}) USING parquet "
            f"CLUSTERED BY (`{layout.key}`) {sorted_by}INTO {layout.buckets} BUCKETS "
            f"LOCATION '{location}'"
        )
    return spark.table(table)
