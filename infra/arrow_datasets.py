"""Small published datasets read and written in this process with pyarrow, no Spark job.

For customer-sized aggregates (the drift check's bins of a few thousand rows) a Spark job costs
more than its rows: reading the files here takes milliseconds. Reads use the dataset's manifest
(the same files Spark would read, partition columns added as strings); writes publish a single
Parquet file as a new generation, as :func:`infra.datasets.publish_dataset` publishes Spark's.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from infra.datasets import DatasetManifest, publish_dataset
from infra.errors import HybridflowInputError
from infra.executor_io import dataset_arrow_schema, read_part_file
from infra.store import ObjectStore


def read_table(
    store: ObjectStore, manifest: DatasetManifest, columns: Sequence[str] | None = None
) -> pa.Table:
    """The ``columns`` (default: all) of every row of the published dataset ``manifest``
    describes."""
    schema = dataset_arrow_schema(store, manifest)
    columns = schema.names if columns is None else columns
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise HybridflowInputError(
            f"dataset {store.key_uri(manifest.prefix)} has no column(s) {missing}"
        )
    wanted = pa.schema([schema.field(c) for c in columns])
    batches = [
        batch
        for key in manifest.files
        for batch in read_part_file(store, manifest.data_prefix, key, wanted)
    ]
    return pa.Table.from_batches(batches, schema=wanted)


def write_table(table: pa.Table, store: ObjectStore, prefix: str) -> DatasetManifest:
    """Publish ``table`` as the dataset at ``prefix`` (one Parquet file)."""
    staging = store.staging_dir()
    out = staging / "data"
    try:
        out.mkdir(parents=True)
        pq.write_table(table, out / "part-00000.parquet")
        return publish_dataset(store, out, prefix, rows=table.num_rows)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
