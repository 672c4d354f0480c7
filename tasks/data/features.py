"""Per-customer features and labels, point-in-time correct (built-in Spark functions only).

Features at cutoff ``c`` use only events with ``event_time <= c``. Training uses features at
``T - H`` with the label "purchased in (T - H, T]"; scoring uses features at ``T``. The
out-of-time backtest trains the same way one horizon earlier: features at ``T - 2H``, labels in
``(T - 2H, T - H]`` (:func:`backtest_examples`), and is judged on the training examples.
Each feature is listed once in :data:`FEATURE_SPECS` (name, the optional column it needs, its
meaning) and computed once in :func:`customer_features`; :func:`feature_names` gives the ones an
input with a given set of columns gets.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

WINDOWS_DAYS: tuple[int, ...] = (7, 30, 90, 180, 365)
NO_PURCHASE_DAYS = 3650.0  # recency/gap stand-in for "never purchased"
EVENT_TYPE_MIX: tuple[str, ...] = ("view", "add_to_cart", "return")
MIX_COLUMNS: dict[str, str] = {"category": "categories", "channel": "channels"}
SECONDS_PER_DAY = 86_400.0
DAY_MICROS = SECONDS_PER_DAY * 1e6


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


def _ts(cutoff: dt.datetime) -> Column:
    # A string literal is read in the session time zone (UTC), unlike a Python datetime literal,
    # which PySpark converts through the process's local time zone.
    return F.lit(_as_naive_utc(cutoff).isoformat(sep=" ")).cast("timestamp")


def _safe_div(num: Column, den: Column) -> Column:
    return F.when(den > 0, num / den).otherwise(0.0)


def customer_features(
    events: DataFrame, cutoff: dt.datetime, available_columns: set[str]
) -> DataFrame:
    """One row per customer with an event at or before ``cutoff``: ``customer_id`` + features.

    ``cutoff`` is a naive UTC datetime (or aware; converted). Nothing after it is read.
    """
    cutoff = _as_naive_utc(cutoff)
    days_before = (F.unix_micros(_ts(cutoff)) - F.unix_micros(F.col("event_time"))) / DAY_MICROS
    past = events.filter(F.col("event_time") <= _ts(cutoff)).select(
        "customer_id",
        "event_time",
        days_before.alias("d"),
        (F.col("event_type") == "purchase").alias("p"),
        "amount",
        "quantity",
        "event_type",
        "category",
        "channel",
    )
    out = past.groupBy("customer_id").agg(*_event_aggregates(available_columns))
    out = out.join(_gap_features(past), "customer_id", "left")
    for col in MIX_COLUMNS:
        if col in available_columns:
            out = out.join(_mix_features(past, col), "customer_id", "left")
    n_p = F.col("n_purchases")
    mean_gap = F.coalesce(F.col("_gap_mean"), F.lit(NO_PURCHASE_DAYS))
    derived = {
        "purchase_recency_days": F.coalesce(F.col("_last_purchase_d"), F.lit(NO_PURCHASE_DAYS)),
        "purchase_amount_mean": _safe_div(F.col("purchase_amount_total"), n_p),
        "mean_interpurchase_days": mean_gap,
        "std_interpurchase_days": F.coalesce(F.col("_gap_std"), F.lit(0.0)),
        "max_interpurchase_days": F.coalesce(F.col("_gap_max"), F.lit(NO_PURCHASE_DAYS)),
        "purchase_recency_over_gap": F.coalesce(F.col("_last_purchase_d"), F.lit(NO_PURCHASE_DAYS))
        / F.greatest(mean_gap, F.lit(1.0)),
        "trend_30d_vs_365d": (F.col("purchases_30d") * (365 / 30)) / (F.col("purchases_365d") + 1),
        "trend_90d_vs_365d": (F.col("purchases_90d") * (365 / 90)) / (F.col("purchases_365d") + 1),
        "trend_amount_90d_vs_365d": (F.col("amount_90d") * (365 / 90))
        / (F.col("amount_365d") + 1.0),
        "basket_size_mean": F.coalesce(F.col("_basket_mean"), F.lit(0.0)),
        "basket_size_max": F.coalesce(F.col("_basket_max"), F.lit(0.0)),
    }
    for w in WINDOWS_DAYS:
        derived[f"amount_mean_{w}d"] = _safe_div(F.col(f"amount_{w}d"), F.col(f"purchases_{w}d"))
    for col, plural in MIX_COLUMNS.items():
        for name in (f"n_{plural}", f"top_{col}_share", f"{col}_entropy"):
            derived[name] = F.coalesce(F.col(f"_{name}"), F.lit(0.0))
    names = feature_names(available_columns)
    return out.select(
        "customer_id",
        *[(derived[n] if n in derived else F.col(n)).cast("double").alias(n) for n in names],
    )


def _event_aggregates(available_columns: set[str]) -> list[Column]:
    """Single-pass aggregates over a customer's past events (``d`` = days before the cutoff)."""
    p, d, amount = F.col("p"), F.col("d"), F.col("amount")
    aggs: list[Column] = [
        F.min(d).alias("recency_days"),
        F.max(d).alias("tenure_days"),
        F.sum(p.cast("double")).alias("n_purchases"),
        F.min(F.when(p, d)).alias("_last_purchase_d"),
        F.sum(F.when(p, amount).otherwise(0.0)).alias("purchase_amount_total"),
        F.avg(F.when(p, F.col("quantity").cast("double"))).alias("_basket_mean"),
        F.max(F.when(p, F.col("quantity").cast("double"))).alias("_basket_max"),
    ]
    for w in WINDOWS_DAYS:
        in_w = d < float(w)
        aggs.append(F.sum((p & in_w).cast("double")).alias(f"purchases_{w}d"))
        aggs.append(F.sum(F.when(p & in_w, amount).otherwise(0.0)).alias(f"amount_{w}d"))
    if "event_type" in available_columns:
        aggs.append(F.count(F.lit(1)).cast("double").alias("n_events"))
        for w in WINDOWS_DAYS:
            aggs.append(F.sum((d < float(w)).cast("double")).alias(f"events_{w}d"))
        for t in ("purchase", *EVENT_TYPE_MIX):
            aggs.append(F.avg((F.col("event_type") == t).cast("double")).alias(f"share_{t}"))
    return aggs


def _gap_features(past: DataFrame) -> DataFrame:
    """Mean, std and max of the days between consecutive purchases (customers with 2+)."""
    order = Window.partitionBy("customer_id").orderBy("event_time")
    gaps = (
        past.filter(F.col("p"))
        .select(
            "customer_id",
            (
                (F.unix_micros("event_time") - F.unix_micros(F.lag("event_time").over(order)))
                / DAY_MICROS
            ).alias("gap"),
        )
        .filter(F.col("gap").isNotNull())
    )
    return gaps.groupBy("customer_id").agg(
        F.avg("gap").alias("_gap_mean"),
        F.stddev_pop("gap").alias("_gap_std"),
        F.max("gap").alias("_gap_max"),
    )


def _mix_features(past: DataFrame, col: str) -> DataFrame:
    """Distinct values, top-value share and entropy of ``col`` among a customer's events."""
    per_value = (
        past.filter(F.col(col).isNotNull())
        .groupBy("customer_id", col)
        .agg(F.count(F.lit(1)).alias("c"))
    )
    c = F.col("c").cast("double")
    totals = per_value.groupBy("customer_id").agg(
        F.count(F.lit(1)).cast("double").alias(f"_n_{MIX_COLUMNS[col]}"),
        F.max(c).alias("_top"),
        F.sum(c).alias("_total"),
        F.sum(c * F.log(c)).alias("_clogc"),
    )
    total = F.col("_total")
    return totals.select(
        "customer_id",
        f"_n_{MIX_COLUMNS[col]}",
        (F.col("_top") / total).alias(f"_top_{col}_share"),
        (F.log(total) - F.col("_clogc") / total).alias(f"_{col}_entropy"),
    )


def purchase_labels(events: DataFrame, start: dt.datetime, end: dt.datetime) -> DataFrame:
    """``customer_id``, ``label`` = 1.0 for customers with a purchase in ``(start, end]``."""
    start, end = _as_naive_utc(start), _as_naive_utc(end)
    return (
        events.filter(
            (F.col("event_type") == "purchase")
            & (F.col("event_time") > _ts(start))
            & (F.col("event_time") <= _ts(end))
        )
        .select("customer_id")
        .distinct()
        .withColumn("label", F.lit(1.0))
    )


def training_examples(
    events: DataFrame, as_of: dt.datetime, horizon_days: int, available_columns: set[str]
) -> DataFrame:
    """Features at ``T - H`` joined with labels from ``(T - H, T]`` (0.0 when no purchase)."""
    feature_cutoff = _as_naive_utc(as_of) - dt.timedelta(days=horizon_days)
    features = customer_features(events, feature_cutoff, available_columns)
    labels = purchase_labels(events, feature_cutoff, as_of)
    return features.join(labels, "customer_id", "left").fillna({"label": 0.0})


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


def _as_naive_utc(value: dt.datetime) -> dt.datetime:
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value


def end_of_day(day: dt.date) -> dt.datetime:
    """The as-of instant for a date: the last microsecond of that UTC day (naive)."""
    return dt.datetime.combine(day, dt.time.max)
