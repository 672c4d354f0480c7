"""Per-customer features and labels, point-in-time correct, computed by Spark SQL.

Features at cutoff ``c`` use only events with ``event_time <= c`` (:mod:`tasks.data.cutoffs`).
:func:`customer_features_at` computes the features at any list of cutoffs, and their labels, in
one pass over the events, as the SQL of :mod:`tasks.data.feature_sql` (the text DuckDB runs in
process): one statement for the whole customer-level table, parsed and planned by the JVM at
once rather than built from thousands of Python ``Column`` objects, a Py4J round trip each.
Which features exist is declared in :mod:`tasks.definitions.feature_specs`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from functools import reduce

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_type

from tasks.data.cutoffs import Cutoff, Origins, as_naive_utc, pipeline_cutoffs
from tasks.data.feature_sql import (
    SequenceSql,
    cutoff_columns,
    origin_column,
    seen_condition,
    wide_sql,
)
from tasks.data.sequences import CUTOFF as SEQ_CUTOFF
from tasks.data.sequences import EVENTS as SEQ_EVENTS
from tasks.data.sequences import pad_sequences, sequence_fields
from tasks.definitions.feature_specs import present_mix_columns


def customer_features(
    events: DataFrame, cutoff: dt.datetime, available_columns: set[str]
) -> DataFrame:
    """One row per customer with an event at or before ``cutoff``: ``customer_id`` + features.

    ``cutoff`` is a naive UTC datetime (or aware; converted). Nothing after it is read.
    """
    at = Cutoff("at", as_naive_utc(cutoff))
    wide = customer_features_at(events, [at], available_columns)
    return cutoff_features(wide, at, available_columns)


def training_examples(
    events: DataFrame,
    as_of: dt.date,
    horizon_days: int,
    available_columns: set[str],
    origins: Origins | None = None,
) -> DataFrame:
    """The training examples of a run at ``as_of`` (T, the end of that day): at each origin
    ``T - H - k s``, the customers seen by it with their features, the label "purchased in
    (T - H - k s, T - k s]" (1.0 or 0.0) and the ``origin``. Nothing after T is read."""
    cutoffs = pipeline_cutoffs(as_of, horizon_days, origins)
    wide = customer_features_at(events, cutoffs.train, available_columns)
    return examples_features(wide, cutoffs.train, available_columns)


def backtest_examples(
    events: DataFrame,
    as_of: dt.date,
    horizon_days: int,
    available_columns: set[str],
    origins: Origins | None = None,
) -> DataFrame:
    """The training examples a run at ``as_of - H`` would have had: origins ``T - 2H - k s``,
    every label window ending at or before ``T - H``. Nothing after ``T - H`` is read."""
    cutoffs = pipeline_cutoffs(as_of, horizon_days, origins)
    wide = customer_features_at(events, cutoffs.backtest, available_columns)
    return examples_features(wide, cutoffs.backtest, available_columns)


def customer_features_at(
    events: DataFrame,
    cutoffs: Sequence[Cutoff],
    available_columns: set[str],
    sequence_length: int = 0,
) -> DataFrame:
    """Features (and labels) at every cutoff from one pass over the events: a wide frame.

    One row per customer with any event: ``customer_id``, ``events_after`` (events after the
    latest cutoff, ignored), then per cutoff its aggregates ``<name>__<aggregate>``, which
    :func:`cutoff_features` turns into the cutoff's features. Every branch is grouped by
    customer and joined on it, so events clustered by customer (a bucketed read) are never
    shuffled. With ``sequence_length`` N > 0 also each customer's events among the N latest
    before a cutoff (``_seq_events``, :func:`tasks.data.feature_sql.sequence_branch`).
    """
    mixes = present_mix_columns(available_columns)
    prepared = events.select(
        "customer_id",
        F.unix_micros("event_time").alias("_t"),
        (F.col("event_type") == "purchase").alias("_p"),
        "amount",
        F.col("quantity").cast("double").alias("_q"),
        "event_type",
        *mixes,
    )
    # the prepared frame goes in as a parameter: no temp view outlives (or, with Spark Connect,
    # falls short of) the lazily analysed result
    sequences = SequenceSql(sequence_length, "spark") if sequence_length else None
    sql = wide_sql("{events}", cutoffs, mixes, sequences)
    return events.sparkSession.sql(sql, events=prepared)


def cutoff_features(
    wide: DataFrame, cutoff: Cutoff, available_columns: set[str], sequence_length: int = 0
) -> DataFrame:
    """The customers seen at ``cutoff`` from a wide frame: ``customer_id`` + its features (with
    ``label`` after them for a labelled cutoff), and with ``sequence_length`` (the wide frame's)
    their sequence columns."""
    rows = wide.filter(seen_condition(cutoff)).selectExpr(
        *cutoff_columns(cutoff, available_columns, sequence_length > 0)
    )
    return padded(rows, sequence_length, available_columns)


def examples_features(
    wide: DataFrame,
    origins: Sequence[Cutoff],
    available_columns: set[str],
    sequence_length: int = 0,
) -> DataFrame:
    """The training examples of the labelled cutoffs ``origins`` from a wide frame: at each, the
    customers seen by it (``customer_id``, features, ``label``) and its ``origin`` (a date), as
    :func:`tasks.data.feature_sql.examples_sql` selects them; with ``sequence_length`` (the wide
    frame's) their sequence columns."""
    if not origins or any(c.label_until is None for c in origins):
        raise ValueError(f"examples need labelled cutoffs, got {[c.name for c in origins]}")
    parts = [
        wide.filter(seen_condition(c)).selectExpr(
            *cutoff_columns(c, available_columns, sequence_length > 0), origin_column(c)
        )
        for c in origins
    ]
    return padded(reduce(DataFrame.unionAll, parts), sequence_length, available_columns)


def padded(rows: DataFrame, sequence_length: int, available_columns: set[str]) -> DataFrame:
    """``rows`` with ``_seq_events``/``_seq_cutoff`` turned into the sequence columns by
    :func:`tasks.data.sequences.pad_sequences` (the numpy code the DuckDB paths run) in the
    job that writes them (``mapInArrow``: no extra job); unchanged without sequences."""
    if not sequence_length:
        return rows
    mixes = present_mix_columns(available_columns)
    kept = [f for f in rows.schema.fields if f.name not in (SEQ_EVENTS, SEQ_CUTOFF)]
    schema = T.StructType(
        kept
        + [T.StructField(f.name, from_arrow_type(f.type), True) for f in sequence_fields(mixes)]
    )

    def pad(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield pad_sequences(batch, sequence_length, mixes)

    return rows.mapInArrow(pad, schema)
