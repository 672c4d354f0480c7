"""The shuffle by customer of the task-per-partition features path, through the store.

Events that are not clustered by customer (an S3 store's executors write them a file per task)
hold a customer's events in several files. One Spark job of a task per events file reads its
file from the store, splits the rows by ``hash(customer_id) % buckets`` (DuckDB's hash) and puts
one piece per bucket it has rows of back into the store (an Arrow IPC file, zstd), under a folder of the caller's
(an unpublished generation); the driver gets (bucket, key, rows) per piece. A bucket's pieces
then hold every event of its customers, so the task per bucket
(:mod:`tasks.engines.spark.features_per_bucket`) computes their features as it does on
validate's buckets.

Against Spark's own shuffle (``repartition`` then ``mapInArrow``) no event crosses between the
JVM and Python: rows go Parquet -> Arrow -> DuckDB -> Parquet inside the Python workers, and
Spark only schedules (at 1.08M events on a two-worker cluster: see docs/benchmarks.md "The
cluster path at engine speed"). A task attempt names its pieces with a token of its own and the
driver takes only the pieces the successful attempts report, so a failed attempt's pieces are
never read (they go with the caller's folder).

Every executor must hash alike: each task reports the DuckDB version that hashed its rows, and
a job whose tasks disagree is refused rather than computing features over split customers.
"""

from __future__ import annotations

import os
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from infra.compute.duckdb_session import duckdb_connection, task_memory_limit
from infra.compute.executor_io import dataset_arrow_schema, executor_store, read_part_file
from infra.storage.datasets import read_dataset_manifest
from infra.storage.store import ObjectStore

PIECE_SUFFIX = ".arrow"
PIECE_BATCH_ROWS = 65_536
PIECE_ARROW = pa.schema(
    [
        pa.field("bucket", pa.int64(), False),
        pa.field("key", pa.string(), False),
        pa.field("rows", pa.int64(), False),
        pa.field("hasher", pa.string(), False),
    ]
)
PIECE = "bucket long, key string, rows long, hasher string"


def hasher() -> str:
    """What hashes the customer ids (the bucket of a customer depends on it)."""
    import duckdb

    return f"duckdb {duckdb.__version__}"


def piece_key(target_prefix: str, bucket: int, token: str) -> str:
    """The store key of one task attempt's piece of ``bucket``."""
    return f"{target_prefix}/bucket-{bucket:05d}/{token}{PIECE_SUFFIX}"


def split_by_customer(
    store: ObjectStore,
    data_prefix: str,
    key: str,
    schema: pa.Schema,
    buckets: int,
    target_prefix: str,
    *,
    memory: str | None = None,
) -> list[tuple[int, str, int]]:
    """Split the events file ``key`` (of the dataset generation ``data_prefix``, read as
    ``schema``) by customer into ``buckets`` buckets, one piece per bucket it has rows of, put
    under ``target_prefix``; returns (bucket, key, rows) per piece."""
    table = pa.Table.from_batches(list(read_part_file(store, data_prefix, key, schema)), schema)
    if table.num_rows == 0:
        return []
    con = duckdb_connection(threads=1, memory=memory)
    try:
        con.register("events", table)
        # a projection keeps the rows' order (DuckDB's preserve_insertion_order, on by default)
        ids = con.sql(f"SELECT (hash(customer_id) % {int(buckets)})::INTEGER FROM events")
        bucket_of = ids.to_arrow_table().column(0)
    finally:
        con.close()
    by_bucket = table.take(pc.sort_indices(bucket_of))
    counts = np.bincount(bucket_of.to_numpy(), minlength=buckets)
    token, pieces, start = uuid.uuid4().hex[:16], [], 0
    for bucket, rows in enumerate(counts.tolist()):
        if rows:
            target = piece_key(target_prefix, bucket, token)
            store.put_bytes(target, piece_bytes(by_bucket.slice(start, rows)))
            pieces.append((bucket, target, rows))
        start += rows
    return pieces


def piece_bytes(rows: pa.Table) -> bytes:
    """A piece as an Arrow IPC file (zstd): written and read several times faster than Parquet
    (at 270k events: 0.15 s against 0.6-0.7 s to split and encode), about 1.5x its size."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_file(sink, rows.schema, options=options) as writer:
        writer.write_table(rows, max_chunksize=PIECE_BATCH_ROWS)
    return sink.getvalue().to_pybytes()


def is_piece(path: Path | str) -> bool:
    """Whether a file is a piece of the shuffle (else: a Parquet file of events)."""
    return str(path).endswith(PIECE_SUFFIX)


def read_pieces(paths: Sequence[Path]) -> pa.RecordBatchReader:
    """The rows of the pieces at ``paths`` (local files) as one stream, a batch at a time."""
    files = [pa.ipc.open_file(pa.memory_map(str(path))) for path in paths]
    batches = (f.get_batch(i) for f in files for i in range(f.num_record_batches))
    return pa.RecordBatchReader.from_batches(files[0].schema, batches)


def shuffle_by_customer(
    spark: SparkSession,
    store: ObjectStore,
    events_prefix: str,
    buckets: int,
    target_prefix: str,
    *,
    slots_per_core: float = 1.0,
) -> list[list[str]]:
    """The published events at ``events_prefix`` re-bucketed by customer into at most
    ``buckets`` buckets under ``target_prefix`` (one job, a task per events file); the pieces
    of each non-empty bucket, in bucket order. ``slots_per_core``: tasks at once per core of
    an executor's machine (1 / ``spark.task.cpus``), which share its memory."""
    manifest = read_dataset_manifest(store, events_prefix)
    files = list(manifest.files)
    if not files:
        return []
    schema = dataset_arrow_schema(store, manifest)
    uri, data_prefix = store.uri, manifest.data_prefix

    def split(ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        source, hashed_by = executor_store(uri), hasher()
        memory = task_memory_limit(max(1, int((os.cpu_count() or 1) * slots_per_core)))
        for batch in ids:
            for index in batch.column(0).to_pylist():
                pieces = split_by_customer(
                    source, data_prefix, files[index], schema, buckets, target_prefix, memory=memory
                )
                yield pa.RecordBatch.from_pylist(
                    [{"bucket": b, "key": k, "rows": n, "hasher": hashed_by} for b, k, n in pieces],
                    schema=PIECE_ARROW,
                )

    tasks = spark.range(0, len(files), 1, numPartitions=len(files))
    return bucket_pieces([r.asDict() for r in tasks.mapInArrow(split, PIECE).collect()])


def bucket_pieces(rows: list[dict]) -> list[list[str]]:
    """The pieces' keys grouped by bucket (non-empty buckets, in bucket order); refuses pieces
    hashed by different hashers (their buckets would split customers)."""
    hashers = sorted({r["hasher"] for r in rows})
    if len(hashers) > 1:
        raise RuntimeError(
            "the executors bucketed customers with different hashers "
            f"({', '.join(hashers)}): every executor needs the same duckdb version"
        )
    by_bucket: dict[int, list[str]] = defaultdict(list)
    for row in rows:
        by_bucket[row["bucket"]].append(row["key"])
    return [sorted(by_bucket[b]) for b in sorted(by_bucket)]
