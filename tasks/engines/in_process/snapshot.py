"""The preprocess stage's snapshot computed in this process: the training examples read with
pyarrow, split by customer (the same split at every origin) and measured for the normaliser with
numpy, published in Spark's layout (``split=<name>/`` folders, the Spark schema recorded). No
Spark job."""

from __future__ import annotations

from typing import Any

from infra.compute.executor_io import dataset_arrow_schema
from infra.compute.spark_io import spark_schema_metadata
from infra.storage.arrow_datasets import read_table, write_table
from infra.storage.datasets import DatasetManifest
from infra.storage.store import ObjectStore
from tasks.data.split_in_process import assign_split, split_values
from tasks.definitions.examples import ORIGIN, sequence_columns
from tasks.engines.snapshot_builder import Metadata


class InProcessSnapshotBuilder:
    """The preprocess stage's :class:`~tasks.engines.snapshot_builder.SnapshotBuilder` in this
    process (pyarrow + numpy; no Spark job)."""

    spark_jobs: int | None = 0

    def publish(
        self,
        store: ObjectStore,
        examples: DatasetManifest,
        out_prefix: str,
        features: list[str],
        seed: int,
        metadata: Metadata,
    ) -> tuple[DatasetManifest, dict[str, Any]]:
        """Split ``examples`` by customer and publish them at ``out_prefix`` with
        ``metadata(values)``; returns the dataset and the values (split counts, the normaliser's
        statistics) named as the Spark job's observed aggregates are."""
        carried = [ORIGIN, *sequence_columns(dataset_arrow_schema(store, examples).names)]
        table = read_table(store, examples, ["customer_id", "label", *features, *carried])
        table = table.append_column("split", assign_split(table["customer_id"], seed))
        values = split_values(table, features)
        extra = {**metadata(values), **spark_schema_metadata(table.schema)}
        published = write_table(table, store, out_prefix, partition_by="split", metadata=extra)
        return published, values
