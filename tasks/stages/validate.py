"""The validate stage: read the events, apply the contract's rules, publish good events and the
quarantine (with a reason per row), and fail when too many rows are bad."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession

from infra.compute.spark import SessionProvider
from infra.errors import HybridflowInputError
from infra.fingerprint import (
    code_modules,
    code_version,
    files_fingerprint,
    stage_fingerprint,
)
from infra.settings import in_process_rows_or_default, settings_defaults
from infra.storage.stage_cache import load_cached, save_cached
from infra.storage.store import ObjectStore
from tasks.data.bad_rows import check_bad_fraction
from tasks.data.engine_choice import SPARK, EngineInputs, choose_engine
from tasks.data.input_formats import (
    EventsInput,
    InputOptions,
    inspect_events,
    list_event_files,
    resolve_events_path,
)
from tasks.data.time_windows import event_time_bounds
from tasks.data.validation_duckdb import in_process_type_problem
from tasks.data.validation_sql import RowBounds
from tasks.definitions.contract import CONTRACT_COLUMNS, REASON_EVENT_TIME_IN_FUTURE
from tasks.engines import registry as engines
from tasks.engines.validator import CsvNotReadInProcessError, ValidatedOutputs
from tasks.reporting.records import StageReport, ValidateResult

log = logging.getLogger(__name__)


def validate_stage(
    spark: SparkSession | SessionProvider,
    store: ObjectStore,
    run_id: str,
    events_path: str,
    max_bad_fraction: float,
    options: InputOptions | None = None,
    use_cache: bool = True,
    on_quarantine: Callable[[ValidateResult], None] | None = None,
    in_process_rows: int | None = None,
    bounds: RowBounds | None = None,
) -> ValidateResult:
    """Read, validate and publish the run's good events and its quarantine.

    Input of up to ``in_process_rows`` rows (the flow passes the run's setting; default: the
    declared default), CSV or Parquet of one schema, is validated in this process
    (:mod:`tasks.engines.in_process.validate`) unless a column needs a parser only Spark has
    (:func:`engine_inputs`); anything else by Spark, started only then (also for a CSV file
    DuckDB's reader refuses). Rows outside ``bounds`` (the flow passes
    :func:`~tasks.data.time_windows.event_time_bounds` of the run's settings; default: of the
    declared defaults, now) are quarantined. Unchanged input files, options, floor, lead and
    code reuse an earlier run's output (``report.cached``) when it holds for the
    bounds of now too (:func:`cached_within`). The quarantine is published even when the bad
    fraction is over ``max_bad_fraction``, so the user can look at it (``on_quarantine`` gets
    the result first); then the stage fails with an input error.
    """
    options = options or InputOptions()
    bounds = bounds or event_time_bounds(settings_defaults())
    path = resolve_events_path(events_path)
    files = list_event_files(path)
    fingerprint = stage_fingerprint(
        "validate",
        path=str(path),
        files=files_fingerprint(path, files),
        options=options.model_dump(mode="json"),
        floor=bounds.floor.isoformat(),
        max_amount=bounds.max_amount,
        code=code_version(*code_modules(__name__)),
    )
    result = load_cached(store, "validate", fingerprint, ValidateResult) if use_cache else None
    if result is not None and not cached_within(result, bounds):
        log.info("validate: the cached output was checked against another clock; recomputing")
        result = None
    if result is None:
        result = _validate_now(spark, store, run_id, path, options, bounds, in_process_rows)
        save_cached(
            store,
            "validate",
            fingerprint,
            run_id,
            result,
            [result.events_prefix, result.quarantine_prefix],
        )
    if on_quarantine is not None:
        on_quarantine(result)
    check_bad_fraction(result, max_bad_fraction)
    return result


def _validate_now(
    spark: SparkSession | SessionProvider,
    store: ObjectStore,
    run_id: str,
    path: Path,
    options: InputOptions,
    bounds: RowBounds,
    in_process_rows: int | None,
) -> ValidateResult:
    """Validate and publish with the engine chosen once for the input at ``path`` (Spark when
    DuckDB's reader refuses a CSV): the result, with its engine and the bounds' ceiling."""
    found = inspect_events(path, options)
    choice = choose_engine(
        "validate",
        engine_inputs(
            found,
            in_process_rows_or_default(in_process_rows),
            timestamp_format=options.timestamp_format,
        ),
    )
    log.info("validate: %s (%s)", choice.engine, choice.reason)
    started = time.perf_counter()
    try:
        outputs = engines.validator(choice.engine, spark).validate(
            store, run_id, found, options, bounds
        )
    except CsvNotReadInProcessError as exc:
        log.warning("DuckDB cannot read the CSV (%s): validating with Spark", exc)
        outputs = engines.validator(SPARK, spark).validate(store, run_id, found, options, bounds)
    result = _validated(started, store, path, outputs)
    return result.model_copy(
        update={"event_time_ceiling": bounds.ceiling, "report": result.report.with_engine(choice)}
    )


def cached_within(result: ValidateResult, bounds: RowBounds) -> bool:
    """Whether a cached result (same floor) is what ``bounds`` give: it kept nothing after
    their ceiling, and when it quarantined rows as in the future, its ceiling was no earlier
    (else some of them may be due now)."""
    if result.last_event is not None and result.last_event > bounds.ceiling:
        return False
    if result.quarantine_reasons.get(REASON_EVENT_TIME_IN_FUTURE):
        return result.event_time_ceiling is not None and result.event_time_ceiling >= bounds.ceiling
    return True


def engine_inputs(
    found: EventsInput, limit: int, cluster: bool = False, timestamp_format: str | None = None
) -> EngineInputs:
    """What the engine choice looks at for the events input ``found``: its rows, and why only
    Spark reads it (Parquet files of several schemas or in partition folders, a column only
    Spark parses: a type, or text times in a ``timestamp_format`` DuckDB does not read as Spark
    does), if it does. CSV files are read in process too (all text)."""
    schema = found.arrow_schema
    if found.format == "csv":
        schema = pa.schema([(c, pa.string()) for c in found.columns if c in CONTRACT_COLUMNS])
    if schema is None:
        problem: str | None = (
            "Parquet files of several schemas or in partition folders, read by Spark"
        )
    else:
        problem = in_process_type_problem(schema, timestamp_format)
    return EngineInputs(
        rows=found.rows_estimate,
        rows_estimated=found.rows_estimated,
        limit=limit,
        cluster=cluster,
        layout_problem=problem,
    )


def validate_events(
    spark: SparkSession,
    store: ObjectStore,
    run_id: str,
    path: Path,
    options: InputOptions,
    bounds: RowBounds | None = None,
) -> ValidateResult:
    """Validate the events at ``path`` with Spark (no cache, no engine choice, no bad-fraction
    check): what the JVM class archive records Spark's validation with."""
    started = time.perf_counter()
    found = inspect_events(path, options)
    outputs = engines.validator(SPARK, spark).validate(store, run_id, found, options, bounds)
    return _validated(started, store, path, outputs)


def _validated(
    started: float, store: ObjectStore, path: Path, outputs: ValidatedOutputs
) -> ValidateResult:
    """The stage's result from an engine's published outputs and figures."""
    events, quarantine = outputs.events, outputs.quarantine
    # every input row is either kept, or quarantined (invalid, or an extra duplicate copy)
    rows_read = events.rows + quarantine.rows
    if rows_read == 0:
        raise HybridflowInputError(f"events input is empty (no rows): {path}")
    for reason, count in sorted(outputs.reasons.items()):
        log.warning("quarantined %d row(s): %s", count, reason)
    return ValidateResult(
        report=StageReport(
            name="validate",
            seconds=time.perf_counter() - started,
            rows_in=rows_read,
            rows_out=events.rows,
            spark_jobs=outputs.spark_jobs,
        ),
        events_prefix=events.prefix,
        quarantine_prefix=quarantine.prefix,
        quarantine_uri=store.key_uri(quarantine.data_prefix),
        rows_read=rows_read,
        rows_valid=events.rows,
        rows_quarantined=quarantine.rows,
        quarantine_reasons=outputs.reasons,
        available_columns=outputs.present,
        first_event=_from_micros(outputs.span_micros[0]),
        last_event=_from_micros(outputs.span_micros[1]),
    )


def _from_micros(value: int | None) -> dt.datetime | None:
    # Collected Spark timestamps come back in the Python process's local zone; micros don't.
    if value is None:
        return None
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=int(value))
