"""Datasets read and written by Spark's executors straight from/to the store (no ``s3a``).

Spark here has no ``s3a`` connector (the hadoop-aws jar is not on PyPI), so in local mode an S3
store's datasets pass through the driver's disk. On a cluster that folder is on the wrong
machine, so with an S3 store and separate executors every executor moves its own share through
the store's own client (boto3, the standard AWS credential chain and ``AWS_ENDPOINT_URL`` of the
executor's environment):

- writing: each task writes its rows as Parquet (one file per partition-column value, in Spark's
  ``column=value/`` folders) to a local temporary file, uploads it under the new generation's
  data folder and returns the key and row count; the driver publishes exactly those keys, so a
  failed task attempt's file is never read (and is swept).
- reading: one task per file downloads it and streams its record batches; the schema is read
  from the first file's footer on the driver.

Where folders are the store, Spark reads and writes them itself, which needs the executors to
see this machine's folders: :func:`check_shared_filesystem` says what to configure when not.
"""

from __future__ import annotations

import io
import tempfile
import uuid
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from infra.errors import HybridflowInputError
from infra.layout import dataset_part_key, dataset_partition_values
from infra.settings import HybridflowSettings
from infra.storage.datasets import (
    DatasetManifest,
    new_data_prefix,
    publish_written_dataset,
    read_dataset_manifest,
)
from infra.storage.store import ObjectStore, open_store

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

WRITTEN_SCHEMA = "key string, rows long"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@lru_cache(maxsize=4)
def executor_store(uri: str) -> ObjectStore:
    """The store as seen from an executor's Python worker (one client per worker and URI)."""
    return open_store(uri)


def needs_executor_io(spark: SparkSession, store: ObjectStore) -> bool:
    """True when executors must move the data themselves: a remote store and a cluster."""
    from infra.compute.spark_connect import runs_on_cluster

    return store.local_path("x") is None and runs_on_cluster(spark)


def cluster_host(settings: HybridflowSettings) -> str | None:
    """The host of the Spark Connect server or standalone master; None for local masters."""
    if settings.spark_remote:
        return urlsplit(settings.spark_remote).hostname
    master = settings.spark_master.strip()
    if master.startswith("local"):
        return None
    if master.startswith("spark://"):
        hosts = {urlsplit(f"spark://{h}").hostname for h in master[8:].split(",")}
        return "127.0.0.1" if hosts <= LOOPBACK else master
    return master  # yarn, k8s://...: executors on other machines


def shares_filesystem(settings: HybridflowSettings) -> bool:
    """Whether the executors see this machine's folders (setting, else: local or loopback)."""
    if settings.spark_shared_filesystem is not None:
        return settings.spark_shared_filesystem
    host = cluster_host(settings)
    return host is None or host in LOOPBACK


def check_shared_filesystem(settings: HybridflowSettings, what: str, path: str) -> None:
    """Refuse a local folder a cluster's executors cannot see, naming what to configure; a
    remote ``path`` (``s3://``, ``s3a://``) is the executors' to reach."""
    if urlsplit(path).scheme not in ("", "file") or shares_filesystem(settings):
        return
    raise HybridflowInputError(
        f"{what} {path} is a folder on this machine, which the Spark cluster at "
        f"{cluster_host(settings)} cannot read: put it in S3 (HYBRIDFLOW_STORE=s3://bucket/prefix "
        "for the store; s3a:// events, docs/cluster.md) or, when every executor mounts it at the "
        "same path, set HYBRIDFLOW_SPARK_SHARED_FILESYSTEM=true"
    )


def write_on_executors(
    df: DataFrame,
    store: ObjectStore,
    prefix: str,
    *,
    partition_by: list[str] | None = None,
    metadata: dict[str, Any] | None = None,
) -> DatasetManifest:
    """Write ``df`` from the executors into a new generation at ``prefix`` and publish it."""
    data_prefix, written = write_task_files(df, store, prefix, partition_by=partition_by)
    return publish_task_outputs(store, prefix, data_prefix, written, df.schema, metadata)


def write_task_files(
    df: DataFrame, store: ObjectStore, prefix: str, *, partition_by: list[str] | None = None
) -> tuple[str, dict[str, int]]:
    """Write ``df`` from the executors into a new generation folder of ``prefix`` (one job);
    returns that folder and the files the successful tasks wrote (key -> rows), unpublished."""
    data_prefix = new_data_prefix(prefix)
    uri, columns = store.uri, list(partition_by or [])

    def write_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        written = write_part_files(executor_store(uri), data_prefix, batches, columns)
        yield pa.RecordBatch.from_pylist(
            [{"key": k, "rows": n} for k, n in written],
            schema=pa.schema([("key", pa.string()), ("rows", pa.int64())]),
        )

    rows = df.mapInArrow(write_partition, WRITTEN_SCHEMA).collect()
    return data_prefix, {r["key"]: int(r["rows"]) for r in rows}


def publish_task_outputs(
    store: ObjectStore,
    prefix: str,
    data_prefix: str,
    written: dict[str, int],
    schema: Any,
    metadata: dict[str, Any] | None = None,
) -> DatasetManifest:
    """Publish exactly the files the successful tasks reported (``written``: key -> rows): other
    files in the generation folder (a failed attempt's upload) are deleted; an empty result
    gets one empty file with ``schema`` (a Spark StructType), as Spark writes, for readers."""
    written = dict(written)
    if not written:
        written[write_empty_file(store, data_prefix, schema)] = 0
    for stray in set(store.list(data_prefix)) - set(written):
        store.delete(stray)
    return publish_written_dataset(
        store, prefix, data_prefix, sorted(written), rows=sum(written.values()), metadata=metadata
    )


def write_part_files(
    store: ObjectStore,
    data_prefix: str,
    batches: Iterator[pa.RecordBatch],
    partition_by: list[str],
) -> list[tuple[str, int]]:
    """Write one task's batches as Parquet under ``data_prefix`` (a file per partition value,
    partition columns left out of the file as Spark does); returns (key, rows) per file."""
    part_id = uuid.uuid4().hex[:16]
    writers: dict[tuple, tuple[pq.ParquetWriter, Path, int]] = {}
    with tempfile.TemporaryDirectory(prefix="hf-part-") as tmp:
        try:
            for batch in batches:
                for values, rows in split_by_columns(batch, partition_by):
                    if values not in writers:
                        path = Path(tmp) / f"{len(writers)}.parquet"
                        writers[values] = (pq.ParquetWriter(path, rows.schema), path, 0)
                    writer, path, count = writers[values]
                    writer.write_batch(rows)
                    writers[values] = (writer, path, count + rows.num_rows)
        finally:
            for writer, _, _ in writers.values():
                writer.close()
        written = []
        for values, (_, path, count) in writers.items():
            key = dataset_part_key(
                data_prefix, dict(zip(partition_by, values, strict=True)), part_id
            )
            store.put_file(key, path)
            written.append((key, count))
    return written


def split_by_columns(
    batch: pa.RecordBatch, columns: list[str]
) -> Iterator[tuple[tuple[str | None, ...], pa.RecordBatch]]:
    """The batch's rows per distinct value of ``columns`` (as path strings), those columns
    dropped; the whole batch under ``()`` when there are none."""
    if batch.num_rows == 0:
        return
    if not columns:
        yield (), batch
        return
    table = pa.Table.from_batches([batch])
    keep = [c for c in table.column_names if c not in columns]
    combos = table.select(columns).group_by(columns).aggregate([]).to_pylist()
    for combo in combos:
        mask = None
        for name in columns:
            value = combo[name]
            cond = pc.is_null(table[name]) if value is None else pc.equal(table[name], value)
            mask = cond if mask is None else pc.and_(mask, cond)
        part = table.filter(mask).select(keep).combine_chunks()
        values = tuple(None if combo[c] is None else str(combo[c]) for c in columns)
        for rows in part.to_batches():
            yield values, rows


def write_empty_file(store: ObjectStore, data_prefix: str, schema: Any) -> str:
    """An empty Parquet file with ``schema`` (a Spark StructType) in the generation folder."""
    from pyspark.sql.pandas.types import to_arrow_schema

    buffer = io.BytesIO()
    pq.write_table(to_arrow_schema(schema, timezone="UTC").empty_table(), buffer)
    key = dataset_part_key(data_prefix, {}, uuid.uuid4().hex[:16])
    store.put_bytes(key, buffer.getvalue())
    return key


def read_on_executors(spark: SparkSession, store: ObjectStore, prefix: str) -> DataFrame:
    """The published dataset at ``prefix``, one executor task per file."""
    from pyspark.sql.pandas.types import from_arrow_schema

    manifest = read_dataset_manifest(store, prefix)
    files = list(manifest.files)
    arrow_schema = dataset_arrow_schema(store, manifest)
    spark_schema = from_arrow_schema(arrow_schema, prefer_timestamp_ntz=False)
    uri, data_prefix = store.uri, manifest.data_prefix

    def read_files(ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        source = executor_store(uri)
        for batch in ids:
            for index in batch.column(0).to_pylist():
                yield from read_part_file(source, data_prefix, files[index], arrow_schema)

    ids = spark.range(0, len(files), numPartitions=max(1, len(files)))
    return ids.mapInArrow(read_files, spark_schema)


def dataset_arrow_schema(store: ObjectStore, manifest: DatasetManifest) -> pa.Schema:
    """The dataset's columns: the first file's footer, then its partition columns (strings)."""
    if not manifest.files:
        raise HybridflowInputError(f"dataset {store.key_uri(manifest.prefix)} has no files")
    first = manifest.files[0]
    schema = pq.read_schema(io.BytesIO(store.get_bytes(first)))
    for name in dataset_partition_values(manifest.data_prefix, first):
        if name not in schema.names:
            schema = schema.append(pa.field(name, pa.string()))
    # as Spark reads Parquet: every column nullable
    return pa.schema([f.with_nullable(True) for f in schema])


def read_part_file(
    store: ObjectStore, data_prefix: str, key: str, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """One Parquet file's record batches with its partition columns added, cast to ``schema``;
    only ``schema``'s columns are read, a batch at a time (a local file is not loaded whole)."""
    local = store.local_path(key)
    with pq.ParquetFile(local if local is not None else io.BytesIO(store.get_bytes(key))) as part:
        stored = set(part.schema_arrow.names)
        partitions = dataset_partition_values(data_prefix, key)
        wanted = [name for name in schema.names if name in stored]
        for batch in part.iter_batches(batch_size=65_536, columns=wanted):
            columns = [
                batch.column(name)
                if name in stored
                else pa.array([partitions[name]] * batch.num_rows, pa.string())
                for name in schema.names
            ]
            yield pa.RecordBatch.from_arrays(columns, names=schema.names).cast(schema)
