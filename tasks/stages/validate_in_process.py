"""The validate stage's outputs computed in this process: the events read with pyarrow, checked
and deduplicated by DuckDB (:mod:`tasks.data.validation_duckdb`), both outputs published with
the Spark schema recorded. No Spark job, no JVM."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as pads

from infra.arrow_datasets import write_table
from infra.datasets import DatasetManifest
from infra.errors import HybridflowInputError
from infra.layout import run_dataset_prefix
from infra.store import ObjectStore
from tasks.data.contract import CONTRACT_COLUMNS
from tasks.data.input_formats import EventsInput, warn_extra_columns
from tasks.data.validation_duckdb import InProcessValidation, ValidationFigures
from tasks.stages.spark_io import spark_schema_metadata


def read_contract_columns(found: EventsInput) -> pa.Table:
    """The contract columns of the Parquet files ``found`` describes, named as the contract."""
    if found.arrow_schema is None or found.source_columns is None:
        raise ValueError("only Parquet files with one schema are read in process")
    wanted = [c for c in CONTRACT_COLUMNS if c in found.arrow_schema.names]
    sources = [found.source_columns[c] for c in wanted]
    try:
        table = pads.dataset([str(f) for f in found.files], format="parquet").to_table(sources)
    except (OSError, pa.ArrowException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HybridflowInputError(f"cannot read events at {found.path}: {first}") from None
    return table.rename_columns(wanted)


def publish_validated_in_process(
    store: ObjectStore, run_id: str, found: EventsInput
) -> tuple[DatasetManifest, DatasetManifest, ValidationFigures]:
    """Validate the input and publish the run's good events and quarantine; with the figures."""
    warn_extra_columns(found.columns)
    checked = InProcessValidation(read_contract_columns(found))
    try:
        good, quarantine = checked.good(), checked.quarantine()
        figures = checked.figures()
    finally:
        checked.close()
    events = write_table(
        good,
        store,
        run_dataset_prefix(run_id, "events"),
        metadata=spark_schema_metadata(good.schema),
    )
    quarantined = write_table(
        quarantine,
        store,
        run_dataset_prefix(run_id, "quarantine"),
        metadata=spark_schema_metadata(quarantine.schema),
    )
    return events, quarantined, figures
