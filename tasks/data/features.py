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
from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from tasks.data.cutoffs import Cutoff, as_naive_utc
from tasks.data.feature_sql import cutoff_columns, seen_condition, wide_sql
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
    events: DataFrame, as_of: dt.datetime, horizon_days: int, available_columns: set[str]
) -> DataFrame:
    """Features at ``T - H`` with the label "purchased in (T - H, T]" (1.0 or 0.0)."""
    as_of = as_naive_utc(as_of)
    train = Cutoff("train", as_of - dt.timedelta(days=horizon_days), label_until=as_of)
    wide = customer_features_at(events, [train], available_columns)
    return cutoff_features(wide, train, available_columns)


def backtest_cutoff(as_of: dt.datetime, horizon_days: int) -> dt.datetime:
    """``T - 2H``: the feature cutoff of the backtest's training examples."""
    return as_naive_utc(as_of) - dt.timedelta(days=2 * horizon_days)


def backtest_examples(
    events: DataFrame, as_of: dt.datetime, horizon_days: int, available_columns: set[str]
) -> DataFrame:
    """The training examples a run at ``T - H`` would have had: features at ``T - 2H``, labels
    from ``(T - 2H, T - H]``. Nothing after ``T - H`` is read."""
    earlier = as_naive_utc(as_of) - dt.timedelta(days=horizon_days)
    return training_examples(events, earlier, horizon_days, available_columns)


def customer_features_at(
    events: DataFrame, cutoffs: Sequence[Cutoff], available_columns: set[str]
) -> DataFrame:
    """Features (and labels) at every cutoff from one pass over the events: a wide frame.

    One row per customer with any event: ``customer_id``, ``events_after`` (events after the
    latest cutoff, ignored), then per cutoff its aggregates ``<name>__<aggregate>``, which
    :func:`cutoff_features` turns into the cutoff's features. Every branch is grouped by
    customer and joined on it, so events clustered by customer (a bucketed read) are never
    shuffled.
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
    return events.sparkSession.sql(wide_sql("{events}", cutoffs, mixes), events=prepared)


def cutoff_features(wide: DataFrame, cutoff: Cutoff, available_columns: set[str]) -> DataFrame:
    """The customers seen at ``cutoff`` from a wide frame: ``customer_id`` + its features (with
    ``label`` after them for a labelled cutoff)."""
    return wide.filter(seen_condition(cutoff)).selectExpr(
        *cutoff_columns(cutoff, available_columns)
    )
