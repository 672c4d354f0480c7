"""Validate raw events against the contract: cast, default, and quarantine bad rows with a reason.

Plain Spark functions (DataFrame in, DataFrames out); the Prefect wrapper lives in flows/.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from pathlib import Path

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
from tasks.spark_io import read_dataset, write_dataset
from tasks.stage_records import StageReport, ValidateResult

log = logging.getLogger(__name__)


def detect_format(path: Path) -> str:
    """``parquet`` or ``csv`` from the file name, or from the files inside a folder."""
    if not path.exists():
        raise HybridflowInputError(f"events path not found: {path}")
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    data_files = [p for p in files if not p.name.startswith((".", "_"))]
    suffixes = {p.suffix.lower() for p in data_files}
    if not data_files:
        raise HybridflowInputError(f"events path holds no data files: {path}")
    if suffixes <= {".parquet", ".pq"}:
        return "parquet"
    if suffixes <= {".csv", ".txt"}:
        return "csv"
    raise HybridflowInputError(
        f"cannot tell the format of {path}: expected .parquet or .csv files, "
        f"found {', '.join(sorted(suffixes))}"
    )


def read_events(spark: SparkSession, path: str | Path) -> DataFrame:
    """Read a Parquet/CSV file or folder; column names are lower-cased (matched
    case-insensitively). CSV columns are read as strings and parsed by :func:`conform_events`."""
    path = Path(path).expanduser().resolve()
    fmt = detect_format(path)
    try:
        if fmt == "parquet":
            df = spark.read.parquet(str(path))
        else:
            df = spark.read.option("header", True).option("inferSchema", False).csv(str(path))
    except PySparkException as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HybridflowInputError(f"cannot read events file(s) at {path}: {first}") from exc
    return df.toDF(*[c.strip().lower() for c in df.columns])


def conform_events(df: DataFrame) -> DataFrame:
    """Check required columns, add defaults for missing optional ones, keep raw values as
    strings (``raw_*``) for the quarantine and typed values for everything downstream."""
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise HybridflowInputError(
            f"events are missing required column(s) {', '.join(missing)}; "
            f"found: {', '.join(df.columns) or '(none)'}"
        )
    extra = [c for c in df.columns if c not in CONTRACT_COLUMNS]
    if extra:
        log.warning("ignoring extra event columns: %s", ", ".join(extra))
    raw = [F.col(c).cast("string").alias(f"raw_{c}") for c in CONTRACT_COLUMNS if c in df.columns]
    typed: list[Column] = [
        F.trim(F.col("customer_id").cast("string")).alias("customer_id"),
        _parse_time(df, "event_time").alias("event_time"),
        F.col("amount").try_cast("double").alias("amount"),
    ]
    for name, default in OPTIONAL_DEFAULTS.items():
        if name not in df.columns:
            typed.append(F.lit(default).cast("int" if name == "quantity" else "string").alias(name))
        elif name == "quantity":
            typed.append(F.col("quantity").try_cast("int").alias("quantity"))
        else:
            col = F.trim(F.col(name).cast("string"))
            fallback = F.lit(default).cast("string")
            typed.append(F.when((col.isNull()) | (col == ""), fallback).otherwise(col).alias(name))
    return df.select(*typed, *raw)


def _parse_time(df: DataFrame, name: str) -> Column:
    dtype = dict(df.dtypes)[name]
    if dtype.startswith("timestamp") or dtype == "date":
        return F.col(name).cast("timestamp")
    return F.col(name).cast("string").try_cast("timestamp")


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
    """Good events (contract columns, typed) and quarantined rows (raw values + ``reason``)."""

    good: DataFrame
    quarantine: DataFrame


def split_valid_events(conformed: DataFrame) -> ValidatedEvents:
    """Separate rows that break the contract, then exact duplicates among the rest (kept once)."""
    flagged = conformed.withColumn("reason", quarantine_reason(conformed))
    raw_cols = [c for c in flagged.columns if c.startswith("raw_")]
    invalid = flagged.filter(F.col("reason").isNotNull()).select(*raw_cols, "reason")

    valid = flagged.filter(F.col("reason").isNull()).withColumn(
        "quantity", F.coalesce(F.col("quantity"), F.lit(1))
    )
    grouped = valid.groupBy(*CONTRACT_COLUMNS).agg(
        F.count(F.lit(1)).alias("_copies"), *[F.first(c).alias(c) for c in raw_cols]
    )
    good = grouped.select(*CONTRACT_COLUMNS)
    duplicates = (
        grouped.filter(F.col("_copies") > 1)
        .withColumn("_extra", F.explode(F.sequence(F.lit(2), F.col("_copies"))))
        .select(*raw_cols, F.lit(REASON_DUPLICATE).alias("reason"))
    )
    quarantine = invalid.unionByName(duplicates).select(
        *[F.col(c).alias(c.removeprefix("raw_")) for c in raw_cols], "reason"
    )
    return ValidatedEvents(good=good, quarantine=quarantine)


def validate_stage(
    spark: SparkSession,
    store: ObjectStore,
    run_id: str,
    events_path: str,
    max_bad_fraction: float,
) -> ValidateResult:
    """Read, validate and publish the run's good events and its quarantine.

    The quarantine is published even when the bad fraction is over ``max_bad_fraction``, so the
    user can look at it; then the stage fails with an input error.
    """
    started = time.perf_counter()
    raw = read_events(spark, events_path)
    present = sorted(c for c in CONTRACT_COLUMNS if c in raw.columns)
    conformed = conform_events(raw).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        rows_read = conformed.count()
        if rows_read == 0:
            raise HybridflowInputError(f"events input is empty: {events_path}")
        parts = split_valid_events(conformed)
        quarantine = write_dataset(parts.quarantine, store, f"runs/{run_id}/quarantine")
        events = write_dataset(parts.good, store, f"runs/{run_id}/events")
    finally:
        conformed.unpersist()
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
    bad_fraction = quarantine.rows / rows_read
    for reason, count in sorted(reasons.items()):
        log.warning("quarantined %d row(s): %s", count, reason)
    if bad_fraction > max_bad_fraction:
        raise HybridflowInputError(
            f"{quarantine.rows} of {rows_read} event rows ({bad_fraction:.1%}) are bad, over "
            f"--max-bad-fraction {max_bad_fraction:.1%}: see {store.key_uri(quarantine.data_prefix)}"
        )
    if events.rows == 0:
        raise HybridflowInputError(f"no valid events left after validation of {events_path}")
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


def _from_micros(value: int | None) -> dt.datetime | None:
    # Collected Spark timestamps come back in the Python process's local zone; micros don't.
    if value is None:
        return None
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=int(value))
