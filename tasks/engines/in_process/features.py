"""The features stage's customer-level table computed by DuckDB in this process: DuckDB reads
the events where they lie (a remote store's stream through pyarrow) into its memory-bounded
storage, and each cutoff's output is published as one Parquet file with the Spark schema
recorded (so a Spark stage reads it without a job). No Spark job, no JVM needed."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from infra.compute.duckdb_session import memory_bounded
from infra.compute.spark_io import spark_schema_metadata
from infra.errors import HybridflowInputError
from infra.storage.arrow_datasets import local_files, read_batches, write_table
from infra.storage.datasets import DatasetManifest, customer_files, read_dataset_manifest
from infra.storage.store import ObjectStore
from tasks.data.features_duckdb import EVENT_COLUMNS, InProcessFeatures
from tasks.data.non_finite import non_finite_count
from tasks.engines.feature_frame import FeatureOutput, distinct_cutoffs


class InProcessFeatureFrame:
    """A :class:`tasks.engines.feature_frame.FeatureFrame` for data one process holds easily:
    :class:`tasks.data.features_duckdb.InProcessFeatures` over all the events."""

    spark_jobs: int | None = 0

    def __init__(
        self,
        store: ObjectStore,
        events_prefix: str,
        outputs: list[FeatureOutput],
        available: set[str],
        sequence_length: int = 0,
    ) -> None:
        self._store = store
        self._sequence_length = sequence_length
        self._prefix = events_prefix
        self._cutoffs = distinct_cutoffs(outputs)
        self._available = available
        self._features: InProcessFeatures | None = None

    def __enter__(self) -> InProcessFeatureFrame:
        manifest = read_dataset_manifest(self._store, self._prefix)
        files = local_files(self._store, manifest)
        events = files if files is not None else read_batches(self._store, manifest, EVENT_COLUMNS)
        with memory_bounded("the features stage"):
            self._features = InProcessFeatures(
                events,
                self._cutoffs,
                self._available,
                sequence_length=self._sequence_length,
                customer_files=customer_files(manifest),
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._features is not None:
            self._features.close()

    def _table(self) -> InProcessFeatures:
        if self._features is None:
            raise RuntimeError("use the frame inside its with block")
        return self._features

    def publish(self, output: FeatureOutput) -> tuple[DatasetManifest, float]:
        """Write the customers seen at the output's cutoff; with their label rate (0.0 when
        unlabelled)."""
        with memory_bounded("the features stage"):
            rows = self._table().output_table(output.cutoffs)
        check_finite(rows, output.prefix)
        manifest = write_table(
            rows,
            self._store,
            output.prefix,
            metadata={**spark_schema_metadata(rows.schema), **output.metadata()},
        )
        if not output.labelled or rows.num_rows == 0:
            return manifest, 0.0
        return manifest, float(pc.sum(rows["label"]).as_py()) / rows.num_rows

    def events_after(self) -> int:
        """Events after the latest cutoff."""
        return self._table().events_after()


def check_finite(rows: pa.Table, prefix: str) -> None:
    """HybridflowInputError naming the first feature with NaN or infinite values (how many, and
    a customer's), before anything of ``rows`` is written to ``prefix``."""
    for name, column in zip(rows.column_names, rows.columns, strict=True):
        if not pa.types.is_floating(column.type):
            continue
        count = non_finite_count(column)
        if count:
            bad = pc.fill_null(pc.invert(pc.is_finite(column)), False)
            who = (
                rows["customer_id"].filter(bad)[0].as_py()
                if "customer_id" in rows.column_names
                else "?"
            )
            raise HybridflowInputError(
                f"feature {name} has {count} non-finite value(s) (NaN or infinite; customer "
                f"{who} first) for {prefix}: an event amount too large for the features' "
                "arithmetic? (lower HYBRIDFLOW_MAX_AMOUNT to quarantine such rows); it was not "
                "published"
            )
