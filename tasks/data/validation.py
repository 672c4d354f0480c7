"""The events contract's rules in Spark: cast, default, and flag every row that breaks them.

Plain functions (DataFrame in, DataFrames out); the stage runner that reads the input and
publishes the results is :mod:`tasks.stages.validate`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from tasks.data.input_formats import (
    EPOCH_MILLIS,
    EPOCH_SECONDS,
    check_required_columns,
    warn_extra_columns,
)
from tasks.definitions.contract import (
    CONTRACT_COLUMNS,
    OPTIONAL_DEFAULTS,
    REASON_DUPLICATE,
    REASON_INVALID_AMOUNT,
    REASON_INVALID_EVENT_TIME,
    REASON_INVALID_QUANTITY,
    REASON_MISSING_CUSTOMER_ID,
)


def conform_events(df: DataFrame, timestamp_format: str | None = None) -> DataFrame:
    """Check required columns, add defaults for missing optional ones, keep raw values as
    strings (``raw_*``) for the quarantine and typed values for everything downstream."""
    check_required_columns(df.columns)
    warn_extra_columns(df.columns)
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

    Both come from ``deduplicated``: every distinct input row once with its number of copies,
    shuffled by ``customer_id`` into ``partitions`` partitions (so ``good`` is already clustered
    by customer). It is a lazy local checkpoint: the first write computes it and keeps its rows
    (memory, then disk), the second reads them back instead of reading and shuffling the input
    again; :meth:`release` it after writing both. (A lost executor fails the stage instead of
    recomputing: the price of not encoding the rows into Spark's columnar cache, which cost
    more than the whole group-by.)
    """

    good: DataFrame
    quarantine: DataFrame
    deduplicated: DataFrame
    partitions: int

    def release(self) -> None:
        """Drop the rows the checkpoint keeps now (else they stay until the JVM collects the
        plan, holding memory the next stage could use)."""
        jdf = getattr(self.deduplicated, "_jdf", None)
        if jdf is None:  # Spark Connect: the server drops the checkpoint with the DataFrame
            return
        plan = jdf.queryExecution().analyzed()
        if plan.getClass().getSimpleName() == "LogicalRDD":
            plan.rdd().unpersist(False)


def split_valid_events(conformed: DataFrame, partitions: int) -> ValidatedEvents:
    """Separate rows that break the contract, then exact duplicates among the rest (kept once).

    One shuffle by ``customer_id`` and one group-by over all columns (typed values, and the raw
    input strings only for rows that break a rule) count the copies of every distinct row:
    a good row is kept once and its extra copies are recorded with the values of the row that
    was kept; a bad row goes to the quarantine as many times as it was read, with its raw
    input strings.
    """
    flagged = conformed.withColumn("reason", quarantine_reason(conformed))
    raw_cols = [c for c in flagged.columns if c.startswith("raw_")]
    bad = F.col("reason").isNotNull()
    typed = [
        F.coalesce(F.col(c), F.lit(1)).alias(c) if c == "quantity" else F.col(c)
        for c in CONTRACT_COLUMNS
    ]
    rows = flagged.select(*typed, *[F.when(bad, F.col(c)).alias(c) for c in raw_cols], "reason")
    deduplicated = (
        rows.repartition(partitions, "customer_id")
        .groupBy(*rows.columns)
        .agg(F.count(F.lit(1)).alias("_copies"))
        .localCheckpoint(eager=False)
    )
    good = deduplicated.filter(~bad).select(*CONTRACT_COLUMNS)
    first_quarantined = F.when(bad, F.lit(1)).otherwise(F.lit(2))
    quarantine = (
        deduplicated.filter(bad | (F.col("_copies") > 1))
        .withColumn("_copy", F.explode(F.sequence(first_quarantined, F.col("_copies"))))
        .select(
            *[
                F.when(bad, F.col(c))
                .otherwise(F.col(c.removeprefix("raw_")).cast("string"))
                .alias(c.removeprefix("raw_"))
                for c in raw_cols
            ],
            F.coalesce(F.col("reason"), F.lit(REASON_DUPLICATE)).alias("reason"),
        )
    )
    return ValidatedEvents(
        good=good, quarantine=quarantine, deduplicated=deduplicated, partitions=partitions
    )
