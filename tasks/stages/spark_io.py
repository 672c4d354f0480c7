"""Moving Spark DataFrames in and out of the store as published datasets."""

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
    manifest = read_dataset_manifest(store, prefix)
    local: Path = local_dataset_dir(store, manifest)
    return spark.read.option("basePath", str(local)).parquet(str(local))
