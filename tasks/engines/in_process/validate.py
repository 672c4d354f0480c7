"""The validate stage's outputs computed in this process: DuckDB reads the Parquet files where
they lie, checks and de-duplicates the rows (:mod:`tasks.data.validation_duckdb`) and streams
both outputs into Parquet files, published with their Spark schema recorded. No Spark job, no
JVM; memory holds the de-duplicated rows, not the input or the outputs: all of them, or above
:data:`tasks.data.validation_duckdb.EVENTS_PER_PASS` rows a share of the customers' at a time,
each share's good events a file of their own (the manifest says so,
:data:`infra.storage.datasets.CUSTOMER_FILES_KEY`: the features stage takes them as its passes)."""

from __future__ import annotations

import shutil

import duckdb

from infra.compute.duckdb_session import memory_bounded
from infra.compute.spark_io import spark_schema_metadata
from infra.errors import HybridflowInputError
from infra.layout import run_dataset_prefix
from infra.storage.datasets import CUSTOMER_FILES_KEY, DatasetManifest, publish_dataset
from infra.storage.store import ObjectStore
from tasks.data.input_formats import (
    EventsInput,
    InputOptions,
    ParsedCounts,
    choose_timestamp_format,
    warn_extra_columns,
)
from tasks.data.validation_duckdb import (
    GOOD_EVENTS_SCHEMA,
    FormatDetector,
    InProcessValidation,
    ValidationFigures,
    validation_passes,
)
from tasks.data.validation_sql import RowBounds
from tasks.definitions.contract import CONTRACT_COLUMNS
from tasks.engines.validator import CsvNotReadInProcessError, ValidatedOutputs


class InProcessValidator:
    """The validate stage's :class:`~tasks.engines.validator.Validator` in this process
    (DuckDB); raises :class:`CsvNotReadInProcessError` for a CSV its reader refuses."""

    def validate(
        self,
        store: ObjectStore,
        run_id: str,
        found: EventsInput,
        options: InputOptions,
        bounds: RowBounds | None,
    ) -> ValidatedOutputs:
        events, quarantine, figures = publish_validated_in_process(
            store, run_id, found, bounds, options.timestamp_format, options.purchase_event
        )
        return ValidatedOutputs(
            events=events,
            quarantine=quarantine,
            reasons=figures.quarantined,
            present=sorted(c for c in CONTRACT_COLUMNS if c in found.columns),
            span_micros=(figures.first_micros, figures.last_micros),
            spark_jobs=0,
        )


def publish_validated_in_process(
    store: ObjectStore,
    run_id: str,
    found: EventsInput,
    bounds: RowBounds | None = None,
    timestamp_format: str | None = None,
    purchase_event: str | None = None,
) -> tuple[DatasetManifest, DatasetManifest, ValidationFigures]:
    """Validate the input ``found`` describes (Parquet files of one schema or CSV files of one
    header, see :func:`tasks.data.input_formats.inspect_events`), event times within
    ``bounds`` when given (text times read with ``timestamp_format``, else in the format a
    sample shows; ``purchase_event``: the log's own name for a purchase), and publish the
    run's good events and quarantine; with the figures."""
    warn_extra_columns(found.columns)
    detect = None if timestamp_format else _format_detector(found)
    with memory_bounded(f"validating {found.path}"):
        try:
            checked = _checked(found, bounds, timestamp_format, detect, purchase_event)
        except duckdb.OutOfMemoryException:
            raise
        except duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if found.format == "csv":
                raise CsvNotReadInProcessError(f"{found.path}: {first}") from None
            raise HybridflowInputError(f"cannot read events at {found.path}: {first}") from None
        good, bad = store.staging_dir(), store.staging_dir()
        try:
            (good / "data").mkdir(parents=True)
            (bad / "data").mkdir(parents=True)
            figures = checked.write_outputs(good / "data", bad / "data")
            events = publish_dataset(
                store,
                good / "data",
                run_dataset_prefix(run_id, "events"),
                rows=figures.rows_valid,
                # a file per share of the customers (InProcessValidation.write_outputs)
                metadata={**spark_schema_metadata(GOOD_EVENTS_SCHEMA), CUSTOMER_FILES_KEY: True},
            )
            quarantine = publish_dataset(
                store,
                bad / "data",
                run_dataset_prefix(run_id, "quarantine"),
                rows=figures.rows_quarantined,
                metadata=spark_schema_metadata(checked.quarantine_schema()),
            )
        finally:
            checked.close()
            shutil.rmtree(good, ignore_errors=True)
            shutil.rmtree(bad, ignore_errors=True)
    return events, quarantine, figures


def _format_detector(found: EventsInput) -> FormatDetector:
    def detect(samples: list[str], count_parsed: ParsedCounts) -> str | None:
        return choose_timestamp_format(samples, found.path, count_parsed)

    return detect


def _checked(
    found: EventsInput,
    bounds: RowBounds | None,
    timestamp_format: str | None,
    detect: FormatDetector | None,
    purchase_event: str | None = None,
) -> InProcessValidation:
    passes = validation_passes(found.rows_estimate)
    if found.format == "csv" and found.csv_dialect is not None:
        return InProcessValidation.of_csv(
            found.files,
            found.csv_dialect,
            found.columns,
            timestamp_format=timestamp_format,
            detect_format=detect,
            bounds=bounds,
            passes=passes,
            purchase_event=purchase_event,
        )
    if found.arrow_schema is None or found.source_columns is None:
        raise ValueError("only Parquet files of one schema or CSV files are validated in process")
    return InProcessValidation.of_parquet(
        found.files,
        found.arrow_schema,
        found.source_columns,
        bounds,
        timestamp_format=timestamp_format,
        detect_format=detect,
        passes=passes,
        purchase_event=purchase_event,
    )
