"""Published datasets read and written in this process with pyarrow, no Spark job.

For data one machine holds easily (the drift check's bins of a few thousand rows, the features
and snapshot of up to ``in_process_rows`` events) a Spark job costs more than its rows. Reads
use the dataset's manifest (the same files Spark would read, partition columns added as
strings); writes publish Parquet files as a new generation, as
:func:`infra.storage.datasets.publish_dataset` publishes Spark's, in Spark's partition layout.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from infra.compute.executor_io import dataset_arrow_schema, read_part_file
from infra.errors import HybridflowInputError
from infra.storage.datasets import DatasetManifest, publish_dataset
from infra.storage.store import ObjectStore

PART_FILE = "part-00000.parquet"
WRITE_OPTIONS: dict[str, Any] = {"use_dictionary": False}
"""How :func:`write_table` writes Parquet: no dictionary pages. Its tables are features and
snapshots (doubles of mostly distinct values, a customer id per row), where pyarrow's attempted
dictionaries took 2-3x the write's CPU (0.28-0.39 s -> 0.14 s for 178,696 examples x 49
columns) and the files were 18 MB instead of 21."""


def read_table(
    store: ObjectStore, manifest: DatasetManifest, columns: Sequence[str] | None = None
) -> pa.Table:
    """The ``columns`` (default: all) of every row of the published dataset ``manifest``
    describes."""
    return read_batches(store, manifest, columns).read_all()


def read_batches(
    store: ObjectStore, manifest: DatasetManifest, columns: Sequence[str] | None = None
) -> pa.RecordBatchReader:
    """:func:`read_table`'s rows as a stream: a file is read as the reader is consumed, so
    memory holds one batch, not the dataset."""
    schema = dataset_arrow_schema(store, manifest)
    columns = schema.names if columns is None else columns
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise HybridflowInputError(
            f"dataset {store.key_uri(manifest.prefix)} has no column(s) {missing}"
        )
    wanted = pa.schema([schema.field(c) for c in columns])
    batches = (
        batch
        for key in manifest.files
        for batch in read_part_file(store, manifest.data_prefix, key, wanted)
    )
    return pa.RecordBatchReader.from_batches(wanted, batches)


def local_files(store: ObjectStore, manifest: DatasetManifest) -> list[Path] | None:
    """The dataset's files on this machine's disk, or None when the store keeps them remotely."""
    paths = [store.local_path(key) for key in manifest.files]
    return None if any(path is None for path in paths) else [p for p in paths if p is not None]


def write_table(
    table: pa.Table,
    store: ObjectStore,
    prefix: str,
    *,
    partition_by: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> DatasetManifest:
    """Publish ``table`` as the dataset at ``prefix``: one Parquet file, or with ``partition_by``
    one file per value in ``<column>=<value>/`` folders without that column (Spark's layout;
    no folder for a value without rows)."""

    def write(out: Path) -> None:
        if partition_by is None:
            pq.write_table(table, out / PART_FILE, **WRITE_OPTIONS)
            return
        rest = table.drop_columns([partition_by])
        values = table[partition_by]
        for value in pc.unique(values).to_pylist():
            folder = out / f"{partition_by}={value}"
            folder.mkdir()
            pq.write_table(
                rest.filter(pc.equal(values, value)), folder / PART_FILE, **WRITE_OPTIONS
            )

    return publish_written(store, prefix, write, rows=table.num_rows, metadata=metadata)


def publish_written(
    store: ObjectStore,
    prefix: str,
    write: Callable[[Path], None],
    *,
    rows: int,
    metadata: dict[str, Any] | None = None,
) -> DatasetManifest:
    """Publish what ``write`` puts into the (empty, local) folder it is given as the dataset at
    ``prefix`` of ``rows`` rows; nothing is published if it fails."""
    staging = store.staging_dir()
    out = staging / "data"
    try:
        out.mkdir(parents=True)
        write(out)
        return publish_dataset(store, out, prefix, rows=rows, metadata=metadata)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
