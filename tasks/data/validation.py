"""The events contract in Spark: the input conformed (cast, parsed, defaulted) by Spark's parsers,
then the rules of :mod:`tasks.data.validation_sql` (the text DuckDB runs too) as Spark SQL.

Plain functions (DataFrame in, DataFrames out); the stage runner that reads the input and
publishes the results is :mod:`tasks.stages.validate`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from tasks.data.event_time_spark import parse_event_time
from tasks.data.input_formats import (
    check_required_columns,
    comma_grouped_sql,
    decimal_comma_sql,
    warn_extra_columns,
)
from tasks.data.validation_sql import (
    ROW_KEY,
    RowBounds,
    contract_rules,
    deduplicated_sql,
    good_sql,
    quarantine_sql,
)
from tasks.definitions.contract import (
    CONTRACT_COLUMNS,
    INTEGRAL_DECIMAL_ID,
    OPTIONAL_DEFAULTS,
    WHOLE_DOUBLES,
    event_type_sql,
)

SQL_FUNCTIONS = {
    "timestamp_text(t BIGINT) RETURNS STRING": "CAST(timestamp_micros(t) AS STRING)",
    "double_text(x DOUBLE) RETURNS STRING": "CAST(x AS STRING)",
    "utc_timestamp(t BIGINT) RETURNS TIMESTAMP": "timestamp_micros(t)",
}
"""The functions :mod:`tasks.data.validation_sql` asks of an engine, in Spark SQL."""


def conform_events(
    df: DataFrame,
    timestamp_format: str | None = None,
    decimal_comma: bool = False,
    purchase_event: str | None = None,
) -> DataFrame:
    """The conformed events :mod:`tasks.data.validation_sql` validates: required columns
    checked, typed values (``event_time`` in microseconds; text amounts with a decimal comma
    when ``decimal_comma``; ``purchase_event`` read as ``purchase``) with defaults for missing
    optional columns, and the input's values
    as strings (``src_*``) for the quarantine."""
    check_required_columns(df.columns)
    warn_extra_columns(df.columns)
    src = [F.col(c).cast("string").alias(f"src_{c}") for c in CONTRACT_COLUMNS if c in df.columns]
    typed: list[Column] = [
        customer_id_text(df).alias("customer_id"),
        F.unix_micros(parse_event_time(df, timestamp_format)).alias("event_time"),
        _amount(df, decimal_comma).try_cast("double").alias("amount"),
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
            if name == "event_type":  # the contract's names for the synonyms logs use
                col = F.expr(event_type_sql(f"trim(CAST(`{name}` AS STRING))", purchase_event))
            fallback = F.lit(default).cast("string")
            typed.append(F.when((col.isNull()) | (col == ""), fallback).otherwise(col).alias(name))
    return df.select(*typed, *src, _row_key(df))


def customer_id_text(df: DataFrame) -> Column:
    """``customer_id`` as text, as every stage holds it: trimmed, a zero fraction dropped
    (:data:`tasks.definitions.contract.INTEGRAL_DECIMAL_ID`: ``13085.0`` is ``13085``); a float
    column's whole numbers as integers (Spark writes ``1.2345678E7`` for ``12345678.0``) and
    NaN as no id."""
    column = F.col("customer_id")
    if dict(df.dtypes)["customer_id"] in ("float", "double"):
        number = column.cast("double")
        whole = (F.abs(number) < WHOLE_DOUBLES) & (number == F.round(number))
        text = F.when(whole, number.try_cast("bigint").cast("string")).when(
            ~F.isnan(number), number.cast("string")
        )
    else:
        text = column.cast("string")
    return F.regexp_replace(F.trim(text), INTEGRAL_DECIMAL_ID, "$1")


def _amount(df: DataFrame, decimal_comma: bool) -> Column:
    """``amount`` as its cast to a double reads it: a decimal comma's text rewritten, else
    thousands commas dropped (``1,234.50``)."""
    if dict(df.dtypes)["amount"] != "string":
        return F.col("amount")
    if decimal_comma:
        return F.expr(decimal_comma_sql("amount", "rlike"))
    return F.expr(comma_grouped_sql("amount", "rlike"))


def _row_key(df: DataFrame) -> Column:
    """A hash of the values of ``df``'s columns outside the contract (null without any)."""
    others = [c for c in df.columns if c not in CONTRACT_COLUMNS]
    if not others:
        return F.lit(None).cast("bigint").alias(ROW_KEY)
    values = [F.col("`" + c.replace("`", "``") + "`").cast("string") for c in others]
    return F.xxhash64(*values).alias(ROW_KEY)


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


def split_valid_events(
    conformed: DataFrame, partitions: int, bounds: RowBounds | None = None
) -> ValidatedEvents:
    """Separate rows that break the contract (with event times within ``bounds`` when given),
    then exact duplicates among the rest (kept once): :mod:`tasks.data.validation_sql` over the
    :func:`conform_events` frame ``conformed``.

    One shuffle by ``customer_id`` and one group-by over all columns (typed values, and the raw
    input strings only for rows that break a rule) count the copies of every distinct row:
    a good row is kept once and its extra copies are recorded with the values of the row that
    was kept; a bad row goes to the quarantine as many times as it was read, with its raw
    input strings.
    """
    spark = conformed.sparkSession
    present = [c for c in CONTRACT_COLUMNS if f"src_{c}" in conformed.columns]
    define_sql_functions(spark, present)
    # the frames go in as parameters: no temp view outlives the lazily analysed results
    deduplicated = spark.sql(
        deduplicated_sql("{conformed}", present, partitions, contract_rules(bounds)),
        conformed=conformed,
    ).localCheckpoint(eager=False)
    return ValidatedEvents(
        good=spark.sql(good_sql("{deduplicated}"), deduplicated=deduplicated),
        quarantine=spark.sql(quarantine_sql("{deduplicated}", present), deduplicated=deduplicated),
        deduplicated=deduplicated,
        partitions=partitions,
    )


def define_sql_functions(spark: SparkSession, present: list[str]) -> None:
    """The session's definitions of the functions the validation SQL calls: the input values
    are strings already (:func:`conform_events`)."""
    functions = SQL_FUNCTIONS | {f"input_text_{c}(x STRING) RETURNS STRING": "x" for c in present}
    for signature, body in functions.items():
        spark.sql(f"CREATE OR REPLACE TEMPORARY FUNCTION {signature} RETURN {body}")
