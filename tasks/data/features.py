"""Per-customer features and labels, point-in-time correct (built-in Spark functions only).

Features at cutoff ``c`` use only events with ``event_time <= c``. The pipeline trains on
features at ``T - H`` with the label "purchased in (T - H, T]" and scores features at ``T``; the
out-of-time backtest trains the same way one horizon earlier: features at ``T - 2H``, labels in
``(T - 2H, T - H]`` (:func:`pipeline_cutoffs`, :func:`backtest_examples`).
:func:`customer_features_at` computes the features at any list of cutoffs, and their labels, in
one pass over the events. Which features exist is declared in :mod:`tasks.data.feature_specs`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from tasks.data.feature_formulas import feature_values
from tasks.data.feature_specs import (
    DAY_MICROS,
    EVENT_TYPE_MIX,
    MIX_COLUMNS,
    WINDOWS_DAYS,
    feature_names,
)

EPOCH = dt.datetime(1970, 1, 1)
TRAIN_CUTOFF = "train"
SCORE_CUTOFF = "score"
BACKTEST_CUTOFF = "backtest"


@dataclass(frozen=True)
class Cutoff:
    """A point in time to compute features at (events ``<= at``); with ``label_until`` also the
    label "purchased in ``(at, label_until]``". ``name`` prefixes its columns in a wide frame."""

    name: str
    at: dt.datetime
    label_until: dt.datetime | None = None

    def micros(self) -> int:
        """``at`` as microseconds since the epoch (naive = UTC)."""
        return _micros(self.at)


class PipelineCutoffs(NamedTuple):
    """The cutoffs of a run (see :func:`pipeline_cutoffs`)."""

    train: Cutoff
    score: Cutoff
    backtest: Cutoff


def pipeline_cutoffs(as_of: dt.date, horizon_days: int) -> PipelineCutoffs:
    """The pipeline's cutoffs for T = the end of ``as_of`` and H: training features at T-H
    labelled with "purchased in (T-H, T]", scoring features at T, and the backtest's training
    features at T-2H labelled with "purchased in (T-2H, T-H]"."""
    at = end_of_day(as_of)
    horizon = dt.timedelta(days=horizon_days)
    return PipelineCutoffs(
        train=Cutoff(TRAIN_CUTOFF, at - horizon, label_until=at),
        score=Cutoff(SCORE_CUTOFF, at),
        backtest=Cutoff(BACKTEST_CUTOFF, at - 2 * horizon, label_until=at - horizon),
    )


def customer_features(
    events: DataFrame, cutoff: dt.datetime, available_columns: set[str]
) -> DataFrame:
    """One row per customer with an event at or before ``cutoff``: ``customer_id`` + features.

    ``cutoff`` is a naive UTC datetime (or aware; converted). Nothing after it is read.
    """
    at = Cutoff("at", _as_naive_utc(cutoff))
    wide = customer_features_at(events, [at], available_columns)
    return cutoff_features(wide, at, available_columns)


def training_examples(
    events: DataFrame, as_of: dt.datetime, horizon_days: int, available_columns: set[str]
) -> DataFrame:
    """Features at ``T - H`` with the label "purchased in (T - H, T]" (1.0 or 0.0)."""
    as_of = _as_naive_utc(as_of)
    train = Cutoff("train", as_of - dt.timedelta(days=horizon_days), label_until=as_of)
    wide = customer_features_at(events, [train], available_columns)
    return cutoff_features(wide, train, available_columns)


def backtest_cutoff(as_of: dt.datetime, horizon_days: int) -> dt.datetime:
    """``T - 2H``: the feature cutoff of the backtest's training examples."""
    return _as_naive_utc(as_of) - dt.timedelta(days=2 * horizon_days)


def backtest_examples(
    events: DataFrame, as_of: dt.datetime, horizon_days: int, available_columns: set[str]
) -> DataFrame:
    """The training examples a run at ``T - H`` would have had: features at ``T - 2H``, labels
    from ``(T - 2H, T - H]``. Nothing after ``T - H`` is read."""
    earlier = _as_naive_utc(as_of) - dt.timedelta(days=horizon_days)
    return training_examples(events, earlier, horizon_days, available_columns)


def customer_features_at(
    events: DataFrame, cutoffs: Sequence[Cutoff], available_columns: set[str]
) -> DataFrame:
    """Features (and labels) at every cutoff from one pass over the events: a wide frame.

    One row per customer with any event: ``customer_id``, ``events_after`` (events after the
    latest cutoff, ignored), then per cutoff ``<name>__seen`` (an event at or before it),
    ``<name>__<feature>`` and, for a labelled one, ``<name>__label``.

    Every cutoff comes from the same group-bys: conditional aggregates over the customer's
    events; the gaps between purchases (a window over the purchases only); and, per mix
    column, counts per (customer, value) aggregated again per customer. The branches are
    grouped by customer and joined on it, so events clustered by customer (a bucketed read) are
    never shuffled.
    """
    if not cutoffs or len({c.name for c in cutoffs}) != len(cutoffs):
        raise ValueError(f"cutoffs need distinct names, got {[c.name for c in cutoffs]}")
    mixes = [c for c in MIX_COLUMNS if c in available_columns]
    kinds = "event_type" in available_columns
    prepared = events.select(
        "customer_id",
        F.unix_micros("event_time").alias("_t"),
        (F.col("event_type") == "purchase").alias("_p"),
        "amount",
        F.col("quantity").cast("double").alias("_q"),
        "event_type",
        *mixes,
    )
    latest = max(c.micros() for c in cutoffs)
    aggs = [F.count(F.when(F.col("_t") > F.lit(latest), 1)).alias("events_after")]
    for cutoff in cutoffs:
        aggs += _event_aggregates(cutoff, kinds)
    wide = prepared.groupBy("customer_id").agg(*aggs)
    # Every side is grouped by customer from the same clustered read: a hash join per bucket
    # needs no shuffle, no sort and no broadcast job.
    branches = [_gap_aggregates(prepared, cutoffs)]
    branches += [_mix_aggregates(prepared, col, cutoffs) for col in mixes]
    for branch in branches:
        wide = wide.join(branch.hint("shuffle_hash"), "customer_id", "left")
    columns = [F.col("customer_id"), F.col("events_after")]
    for cutoff in cutoffs:
        columns += _cutoff_columns(cutoff, available_columns)
    return wide.select(*columns)


def cutoff_features(wide: DataFrame, cutoff: Cutoff, available_columns: set[str]) -> DataFrame:
    """The customers seen at ``cutoff`` from a wide frame: ``customer_id`` + its features (with
    ``label`` after them for a labelled cutoff)."""
    columns = [F.col("customer_id")]
    columns += [F.col(_name(cutoff, n)).alias(n) for n in feature_names(available_columns)]
    if cutoff.label_until is not None:
        columns.append(F.col(_name(cutoff, "label")).alias("label"))
    return wide.filter(F.col(_name(cutoff, "seen"))).select(*columns)


def _agg(fn, cutoff: Cutoff, condition: Column, value: Column, name: str) -> Column:
    """``fn`` over ``value`` where ``condition`` holds, named for the cutoff."""
    return fn(F.when(condition, value)).alias(_name(cutoff, name))


def _event_aggregates(cutoff: Cutoff, kinds: bool) -> list[Column]:
    """Conditional aggregates over the events at or before ``cutoff`` (and its label)."""
    c = cutoff.micros()
    t, p, amount, one = F.col("_t"), F.col("_p"), F.col("amount"), F.lit(1)
    past = t <= F.lit(c)
    bought = past & p
    aggs = [
        _agg(F.max, cutoff, past, t, "_last_t"),
        _agg(F.min, cutoff, past, t, "_first_t"),
        _agg(F.count, cutoff, bought, one, "_n_p"),
        _agg(F.max, cutoff, bought, t, "_last_p_t"),
        _agg(F.sum, cutoff, bought, amount, "_amount"),
        _agg(F.avg, cutoff, bought, F.col("_q"), "_basket_mean"),
        _agg(F.max, cutoff, bought, F.col("_q"), "_basket_max"),
    ]
    for w in WINDOWS_DAYS:
        recent = past & (t > F.lit(c - int(w * DAY_MICROS)))
        aggs += [
            _agg(F.count, cutoff, recent & p, one, f"_n_p_{w}"),
            _agg(F.sum, cutoff, recent & p, amount, f"_amount_{w}"),
        ]
        if kinds:
            aggs.append(_agg(F.count, cutoff, recent, one, f"_n_{w}"))
    if kinds:
        aggs.append(_agg(F.count, cutoff, past, one, "_n"))
        for kind in EVENT_TYPE_MIX:
            aggs.append(
                _agg(F.count, cutoff, past & (F.col("event_type") == kind), one, f"_n_{kind}")
            )
    if cutoff.label_until is not None:
        future = (t > F.lit(c)) & (t <= F.lit(_micros(cutoff.label_until)))
        aggs.append(_agg(F.max, cutoff, future & p, F.lit(1.0), "_label"))
    return aggs


def _gap_aggregates(prepared: DataFrame, cutoffs: Sequence[Cutoff]) -> DataFrame:
    """Mean, population std and max of the days between consecutive purchases, per cutoff.

    The gap before each purchase does not depend on the cutoff (the previous purchase is
    earlier), so one window over the purchases serves every cutoff."""
    by_time = Window.partitionBy("customer_id").orderBy("_t")
    gaps = prepared.filter(F.col("_p")).select(
        "customer_id", "_t", ((F.col("_t") - F.lag("_t").over(by_time)) / DAY_MICROS).alias("_gap")
    )
    aggs = []
    for cutoff in cutoffs:
        past = F.col("_t") <= F.lit(cutoff.micros())
        gap = F.col("_gap")
        aggs += [
            _agg(F.avg, cutoff, past, gap, "_gap_mean"),
            _agg(F.stddev_pop, cutoff, past, gap, "_gap_std"),
            _agg(F.max, cutoff, past, gap, "_gap_max"),
        ]
    return gaps.groupBy("customer_id").agg(*aggs)


def _mix_aggregates(prepared: DataFrame, col: str, cutoffs: Sequence[Cutoff]) -> DataFrame:
    """Per cutoff: distinct values of ``col``, the count of the top value, all values, and
    sum(c ln c) over the values' counts c (for the entropy) among the customer's events."""
    counts = (
        prepared.filter(F.col(col).isNotNull())
        .groupBy("customer_id", col)
        .agg(
            *[
                F.count(F.when(F.col("_t") <= F.lit(cutoff.micros()), 1)).alias(cutoff.name)
                for cutoff in cutoffs
            ]
        )
    )
    aggs = []
    for cutoff in cutoffs:
        n = F.col(cutoff.name)
        aggs += [
            _agg(F.count, cutoff, n > 0, F.lit(1), f"_{col}_values"),
            F.max(n).alias(_name(cutoff, f"_{col}_top")),
            F.sum(n).alias(_name(cutoff, f"_{col}_total")),
            _agg(F.sum, cutoff, n > 0, n * F.log(n), f"_{col}_clogc"),
        ]
    return counts.groupBy("customer_id").agg(*aggs)


class SparkOps:
    """The formulas' operations (:class:`tasks.data.feature_formulas.Ops`) as Spark Columns over
    a cutoff's aggregates."""

    def __init__(self, cutoff: Cutoff) -> None:
        self._cutoff = cutoff

    def agg(self, name: str) -> Column:
        return F.col(_name(self._cutoff, name))

    def lit(self, value: float) -> Column:
        return F.lit(value)

    def coalesce(self, value: Column, default: Column) -> Column:
        return F.coalesce(value, default)

    def double(self, value: Column) -> Column:
        return value.cast("double")

    def greatest(self, first: Column, second: Column) -> Column:
        return F.greatest(first, second)

    def log(self, value: Column) -> Column:
        return F.log(value)

    def if_positive(self, test: Column, then: Column, otherwise: Column) -> Column:
        return F.when(test > 0, then).otherwise(otherwise)


def _cutoff_columns(cutoff: Cutoff, available_columns: set[str]) -> list[Column]:
    """The cutoff's features (doubles) from its aggregates, ``seen`` and ``label``."""
    ops = SparkOps(cutoff)
    values = feature_values(ops, cutoff.micros())
    columns = [ops.agg("_last_t").isNotNull().alias(_name(cutoff, "seen"))]
    columns += [
        values[n].cast("double").alias(_name(cutoff, n)) for n in feature_names(available_columns)
    ]
    if cutoff.label_until is not None:
        columns.append(F.coalesce(ops.agg("_label"), F.lit(0.0)).alias(_name(cutoff, "label")))
    return columns


def _name(cutoff: Cutoff, column: str) -> str:
    return f"{cutoff.name}__{column}"


def _micros(value: dt.datetime) -> int:
    return (_as_naive_utc(value) - EPOCH) // dt.timedelta(microseconds=1)


def _as_naive_utc(value: dt.datetime) -> dt.datetime:
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value


def end_of_day(day: dt.date) -> dt.datetime:
    """The as-of instant for a date: the last microsecond of that UTC day (naive)."""
    return dt.datetime.combine(day, dt.time.max)
