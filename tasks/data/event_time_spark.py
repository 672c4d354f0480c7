"""``event_time`` as Spark reads it: native types cast, text parsed with a Spark pattern, an
epoch unit or ISO-8601 (the rules DuckDB's :func:`tasks.data.text_values_duckdb.text_time_micros`
follows in process)."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from tasks.data.timestamp_patterns import EPOCH_MILLIS, EPOCH_SECONDS


def parse_event_time(df: DataFrame, timestamp_format: str | None) -> Column:
    """``event_time`` as a timestamp (naive = UTC): native types cast, strings parsed with the
    given/detected format (ISO-8601 when None); unparsable values become null."""
    dtype = dict(df.dtypes)["event_time"]
    if dtype.startswith("timestamp") or dtype == "date":
        return F.col("event_time").cast("timestamp")
    text = F.trim(F.col("event_time").cast("string"))
    if timestamp_format == EPOCH_SECONDS:
        return _epoch(text.try_cast("bigint"), 1_000_000, F.timestamp_seconds)
    if timestamp_format == EPOCH_MILLIS:
        return _epoch(text.try_cast("bigint"), 1_000, F.timestamp_millis)
    if timestamp_format:
        return F.try_to_timestamp(text, F.lit(timestamp_format))
    return text.try_cast("timestamp")


def _epoch(number: Column, micros_per_unit: int, to_timestamp) -> Column:
    """An epoch number as a timestamp, null where its microseconds overflow a long (Spark fails
    the whole query there, DuckDB's reading gives null: one absurd row is quarantined, not the
    input refused)."""
    longest = 2**63
    low, high = -(longest // micros_per_unit), (longest - 1) // micros_per_unit
    return F.when(number.between(low, high), to_timestamp(number))


def parsed_counts(df: DataFrame, formats: Sequence[str | None]) -> dict[str | None, int]:
    """How many of ``df``'s ``event_time`` values each of ``formats`` parses: one Spark job, a
    pass over the column."""
    counts = df.select(
        *(F.count(parse_event_time(df, fmt)).alias(f"n{i}") for i, fmt in enumerate(formats))
    ).first()
    assert counts is not None  # an aggregate without grouping has one row
    return {fmt: int(counts[f"n{i}"]) for i, fmt in enumerate(formats)}
