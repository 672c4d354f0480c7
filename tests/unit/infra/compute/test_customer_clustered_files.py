"""Which event files hold all of their customers' events: a bucket's files, or a lone file."""

from __future__ import annotations

from infra.compute.spark_io import LAYOUT_KEY, ClusteredLayout, customer_clustered_files
from infra.storage.datasets import DatasetManifest

D = "runs/r/events/data-1"


def _manifest(files: list[str], layout: ClusteredLayout | None = None) -> DatasetManifest:
    metadata = {LAYOUT_KEY: layout.to_metadata()} if layout else {}
    return DatasetManifest(
        prefix="runs/r/events", data_prefix=D, files=files, rows=9, metadata=metadata
    )


def test_bucketed_files_group_by_the_bucket_id_in_their_names():
    files = [
        f"{D}/part-00000-u1_00001.c000.snappy.parquet",
        f"{D}/part-00001-u1_00000.c000.snappy.parquet",
        f"{D}/part-00002-u1_00001.c001.snappy.parquet",  # a second file of bucket 1
        f"{D}/part-00003-u1_00002.parquet",
    ]
    grouped = customer_clustered_files(
        _manifest(files, ClusteredLayout("customer_id", 3)), "customer_id"
    )
    assert grouped == [[files[1]], [files[0], files[2]], [files[3]]]


def test_a_single_file_holds_every_customer():
    only = [f"{D}/part-00000.parquet"]
    assert customer_clustered_files(_manifest(only), "customer_id") == [only]


def test_files_that_may_split_a_customer_are_not_clustered():
    files = [f"{D}/part-00000-u1_00000.c000.parquet", f"{D}/part-00001-u1_00001.c000.parquet"]
    assert customer_clustered_files(_manifest(files), "customer_id") is None  # no layout
    by_other_key = _manifest(files, ClusteredLayout("event_type", 2))
    assert customer_clustered_files(by_other_key, "customer_id") is None
    unnamed = _manifest([f"{D}/a.parquet", f"{D}/b.parquet"], ClusteredLayout("customer_id", 2))
    assert customer_clustered_files(unnamed, "customer_id") is None
