"""Validate raw events against the contract: cast, default, and quarantine bad rows with a reason.

Plain Spark functions (DataFrame in, DataFrames out); the Prefect wrapper lives in flows/.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from py4j.protocol import Py4JJavaError
from pyspark import StorageLevel
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from infra.errors import HybridflowInputError
from infra.store import ObjectStore
from tasks.events_contract import (
    CONTRACT_COLUMNS,
    OPTIONAL_DEFAULTS,
    REASON_DUPLICATE,
    REASON_INVALID_AMOUNT,
    REASON_INVALID_EVENT_TIME,
    REASON_INVALID_QUANTITY,
    REASON_MISSING_CUSTOMER_ID,
    REQUIRED_COLUMNS,
)
from tasks.fingerprint import code_version, files_fingerprint, stage_fingerprint
from tasks.input_formats import (
    EPOCH_MILLIS,
    EPOCH_SECONDS,
    InputOptions,
    list_event_files,
    read_events,
)
from tasks.spark_io import read_dataset, write_dataset
from tasks.stage_cache import load_cached, save_cached
from tasks.stage_records import StageReport, ValidateResult

log = logging.getLogger(__name__)
VALIDATE_CODE = (
    "tasks.validate",
    "tasks.input_formats",
    "tasks.events_contract",
    "tasks.spark_io",
    "infra.datasets",
)


def conform_events(df: DataFrame, timestamp_format: str | None = None) -> DataFrame:
    """Check required columns, add defaults for missing optional ones, keep raw values as
    strings (``raw_*``) for the quarantine and typed values for everything downstream."""
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise HybridflowInputError(
            f"events are missing required column(s) {', '.join(missing)}; "
            f"found: {', '.join(df.columns) or '(none)'} (rename with --map column=yours)"
        )
    extra = [c for c in df.columns if c not in CONTRACT_COLUMNS]
    if extra:
        log.warning("ignoring extra event columns: %s", ", ".join(extra))
    raw = [F.col(c).cast("string").alias(f"raw_{c}") for c in CONTRACT_COLUMNS if c in df.columns]
    typed: list[Column] = [
        F.trim(F.col("customer_id").cast("string")).alias("customer_id"),
        parse_event_time(df, timestamp_format).alias("event_time"),
        F.col("amount").try_cast("double").alias("amount"),
    ]
    for name, default in OPTIONAL_DEFAULTS.items():
        if name not in df.columns:
            typed.append(F.lit(default).cast("int" if name == "quantity" else "string").alias(name))
        elif name == "quantity":
            q = F.col("quantity").try_cast("double")
            whole = ~F.isnan(q) & (q == F.floor(q))
            typed.append(F.when(whole, q.try_cast("int")).alias("quantity"))
        else:
            col = F.trim(F.col(name).cast("string"))
            fallback = F.lit(default).cast("string")
            typed.append(F.when((col.isNull()) | (col == ""), fallback).otherwise(col).alias(name))
    return df.select(*typed, *raw)


def parse_event_time(df: DataFrame, timestamp_format: str | None) -> Column:
    """``event_time`` as a timestamp (naive = UTC): native types cast, strings parsed with the
    given/detected format (ISO-8601 when None); unparsable values become null."""
    dtype = dict(df.dtypes)["event_time"]
    if dtype.startswith("timestamp") or dtype == "date":
        return F.col("event_time").cast("timestamp")
    text = F.trim(F.col("event_time").cast("string"))
    if timestamp_format == EPOCH_SECONDS:
        return F.timestamp_seconds(text.try_cast("bigint"))
    if timestamp_format == EPOCH_MILLIS:
        return F.timestamp_millis(text.try_cast("bigint"))
    if timestamp_format:
        return F.try_to_timestamp(text, F.lit(timestamp_format))
    return text.try_cast("timestamp")


def quarantine_reason(df: DataFrame) -> Column:
    """The first contract rule a conformed row breaks, or null for a good row."""
    amount = F.col("amount")
    bad_amount = amount.isNull() | F.isnan(amount) | (F.abs(amount) == float("inf")) | (amount < 0)
    quantity_given = (
        F.col("raw_quantity").isNotNull() if "raw_quantity" in df.columns else F.lit(False)
    )
    bad_quantity = quantity_given & (F.col("quantity").isNull() | (F.col("quantity") < 1))
    return (
        F.when(
            F.col("customer_id").isNull() | (F.col("customer_id") == ""), REASON_MISSING_CUSTOMER_ID
        )
        .when(F.col("event_time").isNull(), REASON_INVALID_EVENT_TIME)
        .when(bad_amount, REASON_INVALID_AMOUNT)
        .when(bad_quantity, REASON_INVALID_QUANTITY)
    )


@dataclass
class ValidatedEvents:
    """Good events (contract columns, typed) and quarantined rows (raw values + ``reason``).

    ``deduplicated`` is the persisted group-by behind both; unpersist it after writing them.
    """

    good: DataFrame
    quarantine: DataFrame
    deduplicated: DataFrame


def split_valid_events(conformed: DataFrame) -> ValidatedEvents:
    """Separate rows that break the contract, then exact duplicates among the rest (kept once).

    Only the typed contract columns are shuffled and cached (one group-by, computed once for
    both outputs); invalid rows keep their raw input strings, extra copies of an exact
    duplicate are recorded with the values of the row that was kept.
    """
    flagged = conformed.withColumn("reason", quarantine_reason(conformed))
    raw_cols = [c for c in flagged.columns if c.startswith("raw_")]
    invalid = flagged.filter(F.col("reason").isNotNull()).select(*raw_cols, "reason")

    valid = flagged.filter(F.col("reason").isNull()).withColumn(
        "quantity", F.coalesce(F.col("quantity"), F.lit(1))
    )
    grouped = (
        valid.groupBy(*CONTRACT_COLUMNS)
        .agg(F.count(F.lit(1)).alias("_copies"))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    good = grouped.select(*CONTRACT_COLUMNS)
    duplicates = (
        grouped.filter(F.col("_copies") > 1)
        .withColumn("_extra", F.explode(F.sequence(F.lit(2), F.col("_copies"))))
        .select(
            *[F.col(c.removeprefix("raw_")).cast("string").alias(c) for c in raw_cols],
            F.lit(REASON_DUPLICATE).alias("reason"),
        )
    )
    quarantine = invalid.unionByName(duplicates).select(
        *[F.col(c).alias(c.removeprefix("raw_")) for c in raw_cols], "reason"
    )
    return ValidatedEvents(good=good, quarantine=quarantine, deduplicated=grouped)


def validate_stage(
    spark: SparkSession,
    store: ObjectStore,
    run_id: str,
    events_path: str,
    max_bad_fraction: float,
    options: InputOptions | None = None,
    use_cache: bool = True,
    on_quarantine: Callable[[ValidateResult], None] | None = None,
) -> ValidateResult:
    """Read, validate and publish the run's good events and its quarantine.

    Unchanged input files, options and code reuse an earlier run's output (``report.cached``).
    The quarantine is published even when the bad fraction is over ``max_bad_fraction``, so the
    user can look at it (``on_quarantine`` gets the result first); then the stage fails with an
    input error.
    """
    options = options or InputOptions()
    path = Path(events_path).expanduser().resolve()
    files = list_event_files(path)
    fingerprint = stage_fingerprint(
        "validate",
        path=str(path),
        files=files_fingerprint(path, files),
        options=options.model_dump(mode="json"),
        code=code_version(*VALIDATE_CODE),
    )
    result = load_cached(store, "validate", fingerprint, ValidateResult) if use_cache else None
    if result is None:
        result = validate_events(spark, store, run_id, path, options)
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


def validate_events(
    spark: SparkSession, store: ObjectStore, run_id: str, path: Path, options: InputOptions
) -> ValidateResult:
    """Read ``path``, split good rows from bad, publish both; figures for the summary."""
    started = time.perf_counter()
    raw = read_events(spark, path, options)
    present = sorted(c for c in CONTRACT_COLUMNS if c in raw.df.columns)
    parts = split_valid_events(conform_events(raw.df, raw.timestamp_format))
    try:
        quarantine = write_dataset(parts.quarantine, store, f"runs/{run_id}/quarantine")
        events = write_dataset(parts.good, store, f"runs/{run_id}/events")
    except (PySparkException, Py4JJavaError) as exc:
        raise HybridflowInputError(f"cannot read events at {path}: {_first_line(exc)}") from None
    finally:
        parts.deduplicated.unpersist()
    # every input row is either kept, or quarantined (invalid, or an extra duplicate copy)
    rows_read = events.rows + quarantine.rows
    if rows_read == 0:
        raise HybridflowInputError(f"events input is empty (no rows): {path}")
    reasons: dict[str, int] = {}
    if quarantine.rows:
        q = read_dataset(spark, store, quarantine.prefix)
        reasons = {r["reason"]: int(r["count"]) for r in q.groupBy("reason").count().collect()}
    span = (
        read_dataset(spark, store, events.prefix)
        .agg(
            F.min(F.unix_micros("event_time")).alias("first"),
            F.max(F.unix_micros("event_time")).alias("last"),
        )
        .first()
    )
    for reason, count in sorted(reasons.items()):
        log.warning("quarantined %d row(s): %s", count, reason)
    return ValidateResult(
        report=StageReport(
            name="validate",
            seconds=time.perf_counter() - started,
            rows_in=rows_read,
            rows_out=events.rows,
        ),
        events_prefix=events.prefix,
        quarantine_prefix=quarantine.prefix,
        quarantine_uri=store.key_uri(quarantine.data_prefix),
        rows_read=rows_read,
        rows_valid=events.rows,
        rows_quarantined=quarantine.rows,
        quarantine_reasons=reasons,
        available_columns=present,
        first_event=_from_micros(span["first"]) if span else None,
        last_event=_from_micros(span["last"]) if span else None,
    )


def check_bad_fraction(result: ValidateResult, max_bad_fraction: float) -> None:
    """Fail (input error naming the quarantine) when too many rows are bad or none is good."""
    bad_fraction = result.rows_quarantined / max(result.rows_read, 1)
    if bad_fraction > max_bad_fraction:
        raise HybridflowInputError(
            f"{result.rows_quarantined} of {result.rows_read} event rows ({bad_fraction:.1%}) "
            f"are bad, over --max-bad-fraction {max_bad_fraction:.1%}: see {result.quarantine_uri}"
        )
    if result.rows_valid == 0:
        raise HybridflowInputError(
            f"no valid events left after validation: see {result.quarantine_uri}"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _from_micros(value: int | None) -> dt.datetime | None:
    # Collected Spark timestamps come back in the Python process's local zone; micros don't.
    if value is None:
        return None
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=int(value))
