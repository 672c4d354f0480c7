"""Executor-side dataset I/O as pure functions: part keys, splitting by partition columns, part
files written and read back through a store, and which folders a cluster can see."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from pyspark.sql.types import DoubleType, StringType, StructField, StructType

from infra.compute.executor_io import (
    check_shared_filesystem,
    cluster_host,
    publish_task_outputs,
    read_part_file,
    shares_filesystem,
    split_by_columns,
    write_part_files,
)
from infra.errors import HybridflowInputError
from infra.layout import dataset_part_key, dataset_partition_values
from infra.settings import HybridflowSettings
from infra.storage.datasets import find_dataset


def _batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "customer_id": ["a", "b", "c", "d", "e"],
            "amount": [1.0, 2.0, 3.0, 4.0, 5.0],
            "split": ["train", "val", "train", None, "a/b=c%"],
            "day": [dt.date(2024, 1, 1)] * 5,
        }
    )


@pytest.mark.parametrize("value", ["train", "a/b=c%", "with space", None])
def test_part_keys_round_trip_partition_values(value):
    key = dataset_part_key("snapshots/x/data-1", {"split": value}, "p1")
    assert key.startswith("snapshots/x/data-1/split=") and key.endswith("/part-p1.parquet")
    assert key.count("/") == 4, "a value must never open another folder"
    assert dataset_partition_values("snapshots/x/data-1", key) == {"split": value}


def test_unpartitioned_part_key_has_no_folders():
    key = dataset_part_key("features/as_of=2024-01-01/data-1", {}, "p2")
    assert key == "features/as_of=2024-01-01/data-1/part-p2.parquet"
    assert dataset_partition_values("features/as_of=2024-01-01/data-1", key) == {}


def test_split_by_columns_groups_rows_and_drops_the_columns():
    parts = {values: rows for values, rows in split_by_columns(_batch(), ["split"])}
    assert set(parts) == {("train",), ("val",), (None,), ("a/b=c%",)}
    assert parts[("train",)].column("customer_id").to_pylist() == ["a", "c"]
    assert parts[(None,)].column("customer_id").to_pylist() == ["d"]
    assert all("split" not in rows.schema.names for rows in parts.values())
    assert [(v, b.num_rows) for v, b in split_by_columns(_batch(), [])] == [((), 5)]
    assert list(split_by_columns(_batch().slice(0, 0), ["split"])) == []


def test_part_files_written_and_read_back_through_the_store(local_store):
    written = write_part_files(local_store, "d/data-1", iter([_batch(), _batch()]), ["split"])
    assert sorted(n for _, n in written) == [2, 2, 2, 4]
    assert all(k.startswith("d/data-1/split=") for k, _ in written)
    schema = pa.schema(
        [("customer_id", pa.string()), ("amount", pa.float64()), ("day", pa.date32())]
    ).append(pa.field("split", pa.string()))
    (train,) = [k for k, _ in written if "split=train" in k]
    table = pa.Table.from_batches(list(read_part_file(local_store, "d/data-1", train, schema)))
    assert table.schema == schema
    assert table.column("split").to_pylist() == ["train"] * 4
    assert table.column("customer_id").to_pylist() == ["a", "c", "a", "c"]


class _RemoteView:
    """The same store seen as a remote one: no local paths, bytes only."""

    def __init__(self, store):
        self._store = store

    def local_path(self, key):
        return None

    def get_bytes(self, key):
        return self._store.get_bytes(key)


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_part_file_streams_only_the_wanted_columns_a_batch_at_a_time(local_store, where):
    rows = 150_000
    big = pa.RecordBatch.from_pydict(
        {
            "customer_id": [f"c{i}" for i in range(rows)],
            "amount": [float(i) for i in range(rows)],
            "note": ["unread"] * rows,
            "split": ["train"] * rows,
        }
    )
    ((key, _),) = write_part_files(local_store, "s/data-4", iter([big]), ["split"])
    wanted = pa.schema([("split", pa.string()), ("amount", pa.float32())])
    store = local_store if where == "local" else _RemoteView(local_store)
    batches = list(read_part_file(store, "s/data-4", key, wanted))
    assert len(batches) == 3 and all(b.schema == wanted for b in batches)
    table = pa.Table.from_batches(batches)
    assert table.column("amount").to_pylist() == [float(i) for i in range(rows)]
    assert set(table.column("split").to_pylist()) == {"train"}


def test_published_outputs_are_exactly_the_reported_files(local_store):
    keys = [k for k, _ in write_part_files(local_store, "p/data-2", iter([_batch()]), [])]
    local_store.put_bytes("p/data-2/part-failed-attempt.parquet", b"half a file")
    manifest = publish_task_outputs(local_store, "p", "p/data-2", {keys[0]: 5}, schema=None)
    assert manifest.files == keys and manifest.rows == 5
    assert local_store.list("p/data-2") == keys, "a failed attempt's file must be swept"
    assert find_dataset(local_store, "p") == manifest


def test_an_empty_result_is_published_with_one_empty_file(local_store):
    schema = StructType(
        [StructField("customer_id", StringType()), StructField("score", DoubleType())]
    )
    manifest = publish_task_outputs(local_store, "e", "e/data-3", {}, schema=schema)
    assert manifest.rows == 0 and len(manifest.files) == 1
    empty = read_part_file(
        local_store,
        "e/data-3",
        manifest.files[0],
        pa.schema([("customer_id", pa.string()), ("score", pa.float64())]),
    )
    assert sum(b.num_rows for b in empty) == 0


@pytest.mark.parametrize(
    ("settings", "host", "shared"),
    [
        ({}, None, True),
        ({"spark_master": "local[2]"}, None, True),
        ({"spark_master": "spark://127.0.0.1:7077"}, "127.0.0.1", True),
        ({"spark_master": "spark://10.0.0.5:7077"}, "spark://10.0.0.5:7077", False),
        ({"spark_master": "yarn"}, "yarn", False),
        ({"spark_remote": "sc://127.0.0.1:15002"}, "127.0.0.1", True),
        ({"spark_remote": "sc://spark.internal:15002"}, "spark.internal", False),
        (
            {"spark_remote": "sc://spark.internal:15002", "spark_shared_filesystem": True},
            None,
            True,
        ),
    ],
)
def test_which_clusters_see_this_machines_folders(settings, host, shared):
    s = HybridflowSettings(**settings)
    if host is not None:
        assert cluster_host(s) == host
    assert shares_filesystem(s) is shared


def test_a_folder_a_remote_cluster_cannot_see_is_refused_with_what_to_set():
    s = HybridflowSettings(spark_remote="sc://spark.internal:15002")
    with pytest.raises(HybridflowInputError) as refused:
        check_shared_filesystem(s, "the store", "/data/store")
    message = str(refused.value)
    assert "/data/store" in message and "spark.internal" in message
    assert "HYBRIDFLOW_STORE=s3://" in message
    assert "HYBRIDFLOW_SPARK_SHARED_FILESYSTEM=true" in message
    check_shared_filesystem(HybridflowSettings(), "the store", "/data/store")  # local: fine
    for remote in ("s3://bucket/store", "s3a://bucket/events"):  # the executors reach these
        check_shared_filesystem(s, "the store", remote)
