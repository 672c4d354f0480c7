"""Datasets written and read by Spark's executors through the store (what an S3 store on a
cluster uses): the rows, types and partition folders match Spark's own Parquet, and the training
snapshot reader reads the result as it reads Spark's."""

from __future__ import annotations

import datetime as dt

import pytest
from pyspark.sql import functions as F

from infra.compute.executor_io import read_on_executors, write_on_executors
from infra.compute.spark_io import read_dataset, write_dataset
from infra.storage.datasets import local_dataset_dir, read_dataset_manifest
from tasks.ml.snapshot_reader import SnapshotStream

pytestmark = pytest.mark.integration


@pytest.fixture
def events(spark):
    """Every column type the stages hand over, nulls included, in three tasks."""
    return spark.range(0, 3000, numPartitions=3).select(
        F.col("id").cast("string").alias("customer_id"),
        F.when(F.col("id") % 11 == 0, None).otherwise(F.col("id") * 0.5).alias("amount"),
        (F.col("id") % 5).alias("quantity"),
        F.timestamp_seconds(F.lit(1_700_000_000) + F.col("id") * 60).alias("event_time"),
        F.date_add(F.lit(dt.date(2024, 1, 1)), (F.col("id") % 30).cast("int")).alias("day"),
        F.element_at(
            F.array(F.lit("train"), F.lit("val"), F.lit("test")), (F.col("id") % 3 + 1).cast("int")
        ).alias("split"),
    )


def test_rows_and_types_match_sparks_own_parquet(spark, local_store, events):
    native = write_dataset(events, local_store, "native/events")
    ours = write_on_executors(events, local_store, "executors/events", metadata={"k": "v"})
    assert ours.rows == native.rows == 3000
    assert ours.metadata == {"k": "v"} and all(f.endswith(".parquet") for f in ours.files)
    back = read_on_executors(spark, local_store, "executors/events")
    expected = read_dataset(spark, local_store, "native/events")
    assert back.schema == expected.schema
    assert back.exceptAll(expected).count() == 0 and expected.exceptAll(back).count() == 0


def test_a_partitioned_snapshot_reads_like_sparks(spark, local_store, events):
    snapshot = events.select("customer_id", "amount", "quantity", "split").fillna(0.0)
    manifest = write_on_executors(snapshot, local_store, "snap", partition_by=["split"])
    assert {f.split("/")[2] for f in manifest.files} == {"split=train", "split=val", "split=test"}
    back = read_on_executors(spark, local_store, "snap")
    assert back.columns == ["customer_id", "amount", "quantity", "split"]
    counts = {r["split"]: r["count"] for r in back.groupBy("split").count().collect()}
    assert counts == {"train": 1000, "val": 1000, "test": 1000}

    local = local_dataset_dir(local_store, read_dataset_manifest(local_store, "snap"))
    stream = SnapshotStream(root=local, features=["amount", "quantity"])
    assert {s: stream.rows(s) for s in ("train", "val", "test")} == counts


def test_an_empty_frame_gives_an_empty_dataset_with_its_columns(spark, local_store, events):
    manifest = write_on_executors(events.limit(0), local_store, "empty")
    assert manifest.rows == 0 and len(manifest.files) == 1
    back = read_on_executors(spark, local_store, "empty")
    assert back.count() == 0 and back.columns == events.columns
