"""Moving Spark DataFrames in and out of the store as published datasets.

Folder stores are read and written by Spark itself (on a cluster, only where the executors see
this machine's folders); an S3 store on a cluster goes through the executors' own store client
(:mod:`infra.executor_io`), since Spark here has no ``s3a`` connector.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from infra.datasets import (
    DatasetManifest,
    local_dataset_dir,
    publish_dataset,
    read_dataset_manifest,
)
from infra.executor_io import (
    check_shared_filesystem,
    needs_executor_io,
    read_on_executors,
    write_on_executors,
)
from infra.settings import get_settings
from infra.spark_connect import runs_on_cluster
from infra.store import ObjectStore


def write_dataset(
    df: DataFrame,
    store: ObjectStore,
    prefix: str,
    *,
    partition_by: list[str] | None = None,
    metadata: dict[str, Any] | None = None,
) -> DatasetManifest:
    """Write ``df`` as Parquet to a staging folder, count it, then publish it at ``prefix``."""
    if needs_executor_io(df.sparkSession, store):
        return write_on_executors(df, store, prefix, partition_by=partition_by, metadata=metadata)
    check_cluster_sees(df.sparkSession, "the store", store.uri)
    staging = store.staging_dir()
    out = staging / "data"
    try:
        writer = df.write.mode("overwrite")
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        writer.parquet(str(out))
        rows = df.sparkSession.read.parquet(str(out)).count()
        manifest = publish_dataset(store, out, prefix, rows=rows, metadata=metadata)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


def read_dataset(spark: SparkSession, store: ObjectStore, prefix: str) -> DataFrame:
    """The published dataset at ``prefix`` as a DataFrame (downloaded first for S3)."""
    if needs_executor_io(spark, store):
        return read_on_executors(spark, store, prefix)
    check_cluster_sees(spark, "the store", store.uri)
    manifest = read_dataset_manifest(store, prefix)
    local: Path = local_dataset_dir(store, manifest)
    return spark.read.option("basePath", str(local)).parquet(str(local))


def check_cluster_sees(spark: SparkSession, what: str, folder: str) -> None:
    """On a cluster, refuse a local ``folder`` its executors cannot see (says what to set)."""
    if runs_on_cluster(spark):
        check_shared_filesystem(get_settings(), what, folder)
