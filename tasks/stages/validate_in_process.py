"""The validate stage's outputs computed in this process: DuckDB reads the Parquet files where
they lie, checks and de-duplicates the rows (:mod:`tasks.data.validation_duckdb`) and streams
both outputs into Parquet files, published with their Spark schema recorded. No Spark job, no
JVM; memory holds the de-duplicated rows, not the input or the outputs."""

from __future__ import annotations

import duckdb

from infra.arrow_datasets import PART_FILE, publish_written
from infra.datasets import DatasetManifest
from infra.duckdb_session import memory_bounded
from infra.errors import HybridflowInputError
from infra.layout import run_dataset_prefix
from infra.spark_io import spark_schema_metadata
from infra.store import ObjectStore
from tasks.data.input_formats import EventsInput, warn_extra_columns
from tasks.data.validation_duckdb import (
    GOOD_EVENTS_SCHEMA,
    InProcessValidation,
    ValidationFigures,
)
from tasks.data.validation_sql import RowBounds


def publish_validated_in_process(
    store: ObjectStore, run_id: str, found: EventsInput, bounds: RowBounds | None = None
) -> tuple[DatasetManifest, DatasetManifest, ValidationFigures]:
    """Validate the Parquet input ``found`` describes (one schema, see
    :func:`tasks.data.input_formats.inspect_events`), event times within ``bounds`` when
    given, and publish the run's good events and quarantine; with the figures."""
    if found.arrow_schema is None or found.source_columns is None:
        raise ValueError("only Parquet files with one schema are validated in process")
    warn_extra_columns(found.columns)
    with memory_bounded(f"validating {found.path}"):
        try:
            checked = InProcessValidation.of_parquet(
                found.files, found.arrow_schema, found.source_columns, bounds
            )
        except duckdb.OutOfMemoryException:
            raise
        except duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise HybridflowInputError(f"cannot read events at {found.path}: {first}") from None
        try:
            figures = checked.figures()
            events = publish_written(
                store,
                run_dataset_prefix(run_id, "events"),
                lambda out: checked.write_good(out / PART_FILE),
                rows=figures.rows_valid,
                metadata=spark_schema_metadata(GOOD_EVENTS_SCHEMA),
            )
            quarantine = publish_written(
                store,
                run_dataset_prefix(run_id, "quarantine"),
                lambda out: checked.write_quarantine(out / PART_FILE),
                rows=figures.rows_quarantined,
                metadata=spark_schema_metadata(checked.quarantine_schema()),
            )
        finally:
            checked.close()
    return events, quarantine, figures
