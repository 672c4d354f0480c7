"""Per-customer features and labels, point-in-time correct (built-in Spark functions only).

Features at cutoff ``c`` use only events with ``event_time <= c``. Training uses features at
``T - H`` with the label "purchased in (T - H, T]"; scoring uses features at ``T``.
Each feature is listed once in :data:`FEATURE_SPECS` (name, the optional column it needs, its
meaning) and computed once in :func:`customer_features`; :func:`feature_names` gives the ones an
input with a given set of columns gets.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

WINDOWS_DAYS: tuple[int, ...] = (7, 30, 90, 180, 365)
NO_PURCHASE_DAYS = 3650.0  # recency/gap stand-in for "never purchased"
EVENT_TYPE_MIX: tuple[str, ...] = ("view", "add_to_cart", "return")
MIX_COLUMNS: dict[str, str] = {"category": "categories", "channel": "channels"}
SECONDS_PER_DAY = 86_400.0
DAY_MICROS = SECONDS_PER_DAY * 1e6
EPOCH = dt.datetime(1970, 1, 1)


@dataclass(frozen=True)
class FeatureSpec:
    """One feature: its column name, the optional input column it needs, what it means."""

    name: str
    meaning: str
    needs: str | None = None


def _specs() -> tuple[FeatureSpec, ...]:
    s = [
        FeatureSpec("recency_days", "days from the last event of any type to the cutoff"),
        FeatureSpec("tenure_days", "days from the first event to the cutoff"),
        FeatureSpec("n_purchases", "purchases ever"),
        FeatureSpec(
            "purchase_recency_days", f"days since the last purchase ({NO_PURCHASE_DAYS:g} if none)"
        ),
        FeatureSpec("purchase_amount_total", "sum of purchase amounts ever"),
        FeatureSpec("purchase_amount_mean", "mean purchase amount (0 if none)"),
    ]
    for w in WINDOWS_DAYS:
        s += [
            FeatureSpec(f"purchases_{w}d", f"purchases in the last {w} days"),
            FeatureSpec(f"amount_{w}d", f"purchase amount in the last {w} days"),
            FeatureSpec(
                f"amount_mean_{w}d", f"mean purchase amount in the last {w} days (0 if none)"
            ),
        ]
    s += [
        FeatureSpec(
            "mean_interpurchase_days",
            f"mean days between consecutive purchases ({NO_PURCHASE_DAYS:g} if < 2 purchases)",
        ),
        FeatureSpec("std_interpurchase_days", "population std of those gaps (0 if < 2 purchases)"),
        FeatureSpec(
            "max_interpurchase_days", f"longest gap between purchases ({NO_PURCHASE_DAYS:g} if < 2)"
        ),
        FeatureSpec(
            "purchase_recency_over_gap",
            "purchase_recency_days / max(mean_interpurchase_days, 1): > 1 means overdue",
        ),
        FeatureSpec("trend_30d_vs_365d", "purchases_30d scaled to a year / (purchases_365d + 1)"),
        FeatureSpec("trend_90d_vs_365d", "purchases_90d scaled to a year / (purchases_365d + 1)"),
        FeatureSpec("trend_amount_90d_vs_365d", "amount_90d scaled to a year / (amount_365d + 1)"),
        FeatureSpec("basket_size_mean", "mean quantity per purchase (0 if none)", "quantity"),
        FeatureSpec("basket_size_max", "largest quantity in one purchase (0 if none)", "quantity"),
        FeatureSpec("n_events", "events of any type ever", "event_type"),
    ]
    s += [
        FeatureSpec(f"events_{w}d", f"events of any type in the last {w} days", "event_type")
        for w in WINDOWS_DAYS
    ]
    s += [
        FeatureSpec(f"share_{t}", f"share of events that are '{t}'", "event_type")
        for t in ("purchase", *EVENT_TYPE_MIX)
    ]
    for col, plural in MIX_COLUMNS.items():
        s += [
            FeatureSpec(f"n_{plural}", f"distinct {col} values among events", col),
            FeatureSpec(f"top_{col}_share", f"share of events in the customer's top {col}", col),
            FeatureSpec(f"{col}_entropy", f"Shannon entropy (nats) of the {col} mix", col),
        ]
    return tuple(s)


FEATURE_SPECS: tuple[FeatureSpec, ...] = _specs()


def feature_names(available_columns: set[str]) -> list[str]:
    """The features computed for an input that has ``available_columns`` (contract names)."""
    return [s.name for s in FEATURE_SPECS if s.needs is None or s.needs in available_columns]


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


TRAIN_CUTOFF = "train"
SCORE_CUTOFF = "score"


def pipeline_cutoffs(as_of: dt.date, horizon_days: int) -> tuple[Cutoff, Cutoff]:
    """The pipeline's cutoffs for T = the end of ``as_of`` and H: training features at T-H
    labelled with "purchased in (T-H, T]", and scoring features at T."""
    at = end_of_day(as_of)
    train = Cutoff(TRAIN_CUTOFF, at - dt.timedelta(days=horizon_days), label_until=at)
    return train, Cutoff(SCORE_CUTOFF, at)


def customer_features(
    events: DataFrame, cutoff: dt.datetime, available_columns: set[str]
) -> DataFrame:
    """One row per customer with an event at or before ``cutoff``: ``customer_id`` + features.

    ``cutoff`` is a naive UTC datetime (or aware; converted). Nothing after it is read.
    """
    at = Cutoff("at", _as_naive_utc(cutoff))
    return cutoff_features(
        customer_features_at(events, [at], available_columns), at, available_columns
    )


def training_examples(
    events: DataFrame, as_of: dt.datetime, horizon_days: int, available_columns: set[str]
) -> DataFrame:
    """Features at ``T - H`` with the label "purchased in (T - H, T]" (1.0 or 0.0)."""
    as_of = _as_naive_utc(as_of)
    train = Cutoff("train", as_of - dt.timedelta(days=horizon_days), label_until=as_of)
    wide = customer_features_at(events, [train], available_columns)
    return cutoff_features(wide, train, available_columns)


def customer_features_at(
    events: DataFrame, cutoffs: Sequence[Cutoff], available_columns: set[str]
) -> DataFrame:
    """Features (and labels) at every cutoff from one pass over the events: a wide frame.

    One row per customer with any event: ``customer_id``, then per cutoff ``<name>__<feature>``
    (``<name>__label`` for a labelled one, ``<name>__seen`` true when the customer has an event
    at or before it), and ``events_after`` (events after the latest cutoff, ignored).
    Everything that depends on the order of a customer's events (gaps between purchases, running
    counts per category/channel) is computed once for all cutoffs with windows over the
    customer's events; the rest is conditional aggregates in one group-by. Events that
    arrive already clustered by customer (a bucketed read) need no shuffle at all.
    """
    if not cutoffs or len({c.name for c in cutoffs}) != len(cutoffs):
        raise ValueError(f"cutoffs need distinct names, got {[c.name for c in cutoffs]}")
    per_event = _per_event_columns(events, available_columns)
    latest = max(c.micros() for c in cutoffs)
    aggs = [F.count(F.when(F.col("_t") > F.lit(latest), 1)).alias("events_after")]
    for cutoff in cutoffs:
        aggs += _cutoff_aggregates(cutoff, available_columns)
    grouped = per_event.groupBy("customer_id").agg(*aggs)
    derived = [F.col("customer_id"), F.col("events_after")]
    for cutoff in cutoffs:
        derived += _cutoff_columns(cutoff, available_columns)
    return grouped.select(*derived)


def cutoff_features(wide: DataFrame, cutoff: Cutoff, available_columns: set[str]) -> DataFrame:
    """The customers seen at ``cutoff`` from a wide frame: ``customer_id`` + its features (with
    ``label`` after them for a labelled cutoff)."""
    columns = [F.col("customer_id")]
    columns += [F.col(_name(cutoff, n)).alias(n) for n in feature_names(available_columns)]
    if cutoff.label_until is not None:
        columns.append(F.col(_name(cutoff, "label")).alias("label"))
    return wide.filter(F.col(_name(cutoff, "seen"))).select(*columns)


def _per_event_columns(events: DataFrame, available_columns: set[str]) -> DataFrame:
    """The columns the aggregates read, with the order-dependent ones computed once:
    ``_gap`` (days since the customer's previous purchase, on purchases) and, per mix column,
    ``_k_<col>`` (the running count of the event's value) and ``_inc_<col>``
    (``k ln k - (k-1) ln(k-1)``: summed up to a cutoff it is sum(c ln c) over the values)."""
    t = F.unix_micros("event_time")
    p = F.col("event_type") == "purchase"
    by_time = Window.partitionBy("customer_id").orderBy("event_time")
    before = by_time.rowsBetween(Window.unboundedPreceding, -1)
    previous_purchase = F.last(F.when(p, t), ignorenulls=True).over(before)
    columns = [
        F.col("customer_id"),
        t.alias("_t"),
        p.alias("_p"),
        F.col("amount"),
        F.col("quantity").cast("double").alias("_q"),
        F.col("event_type"),
        F.when(p, (t - previous_purchase) / DAY_MICROS).alias("_gap"),
    ]
    for col in MIX_COLUMNS:
        if col in available_columns:
            k = F.row_number().over(Window.partitionBy("customer_id", col).orderBy("event_time"))
            columns += [
                F.col(col).isNotNull().alias(f"_has_{col}"),
                k.alias(f"_k_{col}"),
                (k * F.log(k) - F.when(k > 1, (k - 1) * F.log(k - 1)).otherwise(0.0)).alias(
                    f"_inc_{col}"
                ),
            ]
    return events.select(*columns)


def _cutoff_aggregates(cutoff: Cutoff, available_columns: set[str]) -> list[Column]:
    """Conditional aggregates over the events at or before ``cutoff`` (and its label)."""
    c = cutoff.micros()
    t, p, amount = F.col("_t"), F.col("_p"), F.col("amount")
    past = t <= F.lit(c)
    bought = past & p

    def agg(fn, condition: Column, value: Column, name: str) -> Column:
        return fn(F.when(condition, value)).alias(_name(cutoff, name))

    aggs = [
        agg(F.max, past, t, "_last_t"),
        agg(F.min, past, t, "_first_t"),
        agg(F.count, bought, F.lit(1), "_n_p"),
        agg(F.max, bought, t, "_last_p_t"),
        agg(F.sum, bought, amount, "_amount"),
        agg(F.avg, bought, F.col("_q"), "_basket_mean"),
        agg(F.max, bought, F.col("_q"), "_basket_max"),
        agg(F.avg, bought, F.col("_gap"), "_gap_mean"),
        agg(F.stddev_pop, bought, F.col("_gap"), "_gap_std"),
        agg(F.max, bought, F.col("_gap"), "_gap_max"),
    ]
    for w in WINDOWS_DAYS:
        recent = past & (t > F.lit(c - int(w * DAY_MICROS)))
        aggs += [
            agg(F.count, recent & p, F.lit(1), f"_n_p_{w}"),
            agg(F.sum, recent & p, amount, f"_amount_{w}"),
        ]
        if "event_type" in available_columns:
            aggs.append(agg(F.count, recent, F.lit(1), f"_n_{w}"))
    if "event_type" in available_columns:
        aggs.append(agg(F.count, past, F.lit(1), "_n"))
        for kind in EVENT_TYPE_MIX:
            aggs.append(agg(F.count, past & (F.col("event_type") == kind), F.lit(1), f"_n_{kind}"))
    for col in MIX_COLUMNS:
        if col in available_columns:
            has = past & F.col(f"_has_{col}")
            k = F.col(f"_k_{col}")
            aggs += [
                agg(F.count, has & (k == 1), F.lit(1), f"_{col}_values"),
                agg(F.max, has, k, f"_{col}_top"),
                agg(F.count, has, F.lit(1), f"_{col}_total"),
                agg(F.sum, has, F.col(f"_inc_{col}"), f"_{col}_clogc"),
            ]
    if cutoff.label_until is not None:
        future = (t > F.lit(c)) & (t <= F.lit(_micros(cutoff.label_until)))
        aggs.append(agg(F.max, future & p, F.lit(1.0), "_label"))
    return aggs


def _cutoff_columns(cutoff: Cutoff, available_columns: set[str]) -> list[Column]:
    """The cutoff's features (doubles) from its aggregates, ``seen`` and ``label``."""
    c = F.lit(cutoff.micros())

    def a(name: str) -> Column:
        return F.col(_name(cutoff, name))

    def days(micros: Column) -> Column:
        return (c - micros) / DAY_MICROS

    n_p = a("_n_p").cast("double")
    none = F.lit(NO_PURCHASE_DAYS)
    last_purchase = F.coalesce(days(a("_last_p_t")), none)
    mean_gap = F.coalesce(a("_gap_mean"), none)
    values = {
        "recency_days": days(a("_last_t")),
        "tenure_days": days(a("_first_t")),
        "n_purchases": n_p,
        "purchase_recency_days": last_purchase,
        "purchase_amount_total": F.coalesce(a("_amount"), F.lit(0.0)),
        "purchase_amount_mean": _safe_div(F.coalesce(a("_amount"), F.lit(0.0)), n_p),
        "mean_interpurchase_days": mean_gap,
        "std_interpurchase_days": F.coalesce(a("_gap_std"), F.lit(0.0)),
        "max_interpurchase_days": F.coalesce(a("_gap_max"), none),
        "purchase_recency_over_gap": last_purchase / F.greatest(mean_gap, F.lit(1.0)),
        "basket_size_mean": F.coalesce(a("_basket_mean"), F.lit(0.0)),
        "basket_size_max": F.coalesce(a("_basket_max"), F.lit(0.0)),
    }
    for w in WINDOWS_DAYS:
        amount_w = F.coalesce(a(f"_amount_{w}"), F.lit(0.0))
        values[f"purchases_{w}d"] = a(f"_n_p_{w}").cast("double")
        values[f"amount_{w}d"] = amount_w
        values[f"amount_mean_{w}d"] = _safe_div(amount_w, a(f"_n_p_{w}"))
        if "event_type" in available_columns:
            values[f"events_{w}d"] = a(f"_n_{w}").cast("double")
    values["trend_30d_vs_365d"] = (values["purchases_30d"] * (365 / 30)) / (
        values["purchases_365d"] + 1
    )
    values["trend_90d_vs_365d"] = (values["purchases_90d"] * (365 / 90)) / (
        values["purchases_365d"] + 1
    )
    values["trend_amount_90d_vs_365d"] = (values["amount_90d"] * (365 / 90)) / (
        values["amount_365d"] + 1.0
    )
    if "event_type" in available_columns:
        n = a("_n").cast("double")
        values["n_events"] = n
        values["share_purchase"] = _safe_div(n_p, n)  # n is 0 only where the customer is unseen
        for kind in EVENT_TYPE_MIX:
            values[f"share_{kind}"] = _safe_div(a(f"_n_{kind}"), n)
    for col, plural in MIX_COLUMNS.items():
        if col in available_columns:
            total = a(f"_{col}_total").cast("double")
            values[f"n_{plural}"] = a(f"_{col}_values").cast("double")
            values[f"top_{col}_share"] = _safe_div(a(f"_{col}_top").cast("double"), total)
            values[f"{col}_entropy"] = F.when(
                total > 0, F.log(total) - a(f"_{col}_clogc") / total
            ).otherwise(0.0)
    columns = [a("_last_t").isNotNull().alias(_name(cutoff, "seen"))]
    columns += [
        values[n].cast("double").alias(_name(cutoff, n)) for n in feature_names(available_columns)
    ]
    if cutoff.label_until is not None:
        columns.append(F.coalesce(a("_label"), F.lit(0.0)).alias(_name(cutoff, "label")))
    return columns


def _name(cutoff: Cutoff, column: str) -> str:
    return f"{cutoff.name}__{column}"


def _safe_div(num: Column, den: Column) -> Column:
    return F.when(den > 0, num / den).otherwise(0.0)


def _micros(value: dt.datetime) -> int:
    return (_as_naive_utc(value) - EPOCH) // dt.timedelta(microseconds=1)


def _as_naive_utc(value: dt.datetime) -> dt.datetime:
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value


def end_of_day(day: dt.date) -> dt.datetime:
    """The as-of instant for a date: the last microsecond of that UTC day (naive)."""
    return dt.datetime.combine(day, dt.time.max)
