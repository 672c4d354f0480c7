"""Per-customer features and labels, point-in-time correct (built-in Spark functions only).

Features at cutoff ``c`` use only events with ``event_time <= c``. Training uses features at
``T - H`` with the label "purchased in (T - H, T]"; scoring uses features at ``T``.
Which features exist depends on which optional columns the input had (see
:func:`feature_names`); every feature is defined once, here.
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

WINDOWS_DAYS: tuple[int, ...] = (7, 30, 90, 180, 365)
NO_PURCHASE_DAYS = 3650.0  # recency/gap stand-in for "never purchased"
EVENT_TYPE_MIX: tuple[str, ...] = ("view", "add_to_cart", "return")
SECONDS_PER_DAY = 86_400.0


def feature_names(available_columns: set[str]) -> list[str]:
    """The features computed for an input that has ``available_columns`` (contract names)."""
    names = [
        "recency_days",
        "tenure_days",
        "n_events",
        "n_purchases",
        "purchase_recency_days",
        "purchase_amount_total",
        "purchase_amount_mean",
        "mean_interpurchase_days",
        "basket_size_mean",
    ]
    for w in WINDOWS_DAYS:
        names += [f"purchases_{w}d", f"amount_{w}d"]
    names += ["trend_30d_vs_365d", "trend_90d_vs_365d"]
    if "event_type" in available_columns:
        names += [f"events_{w}d" for w in WINDOWS_DAYS]
        names += [f"share_{t}" for t in EVENT_TYPE_MIX]
    if "category" in available_columns:
        names.append("n_categories")
    if "channel" in available_columns:
        names.append("n_channels")
    return names


def _ts(cutoff: dt.datetime) -> Column:
    # A string literal is read in the session time zone (UTC), unlike a Python datetime literal,
    # which PySpark converts through the process's local time zone.
    return F.lit(_as_naive_utc(cutoff).isoformat(sep=" ")).cast("timestamp")


def customer_features(
    events: DataFrame, cutoff: dt.datetime, available_columns: set[str]
) -> DataFrame:
    """One row per customer with an event at or before ``cutoff``: ``customer_id`` + features.

    ``cutoff`` is a naive UTC datetime (or aware; converted). Nothing after it is read.
    """
    cutoff = _as_naive_utc(cutoff)
    is_purchase = F.col("event_type") == "purchase"
    days_before = (F.unix_micros(_ts(cutoff)) - F.unix_micros(F.col("event_time"))) / (
        SECONDS_PER_DAY * 1e6
    )
    past = events.filter(F.col("event_time") <= _ts(cutoff)).select(
        "customer_id",
        days_before.alias("d"),
        is_purchase.alias("p"),
        "amount",
        "quantity",
        "event_type",
        "category",
        "channel",
    )
    p = F.col("p")
    d = F.col("d")
    aggs: list[Column] = [
        F.min(d).alias("recency_days"),
        F.max(d).alias("tenure_days"),
        F.count(F.lit(1)).cast("double").alias("n_events"),
        F.sum(p.cast("double")).alias("n_purchases"),
        F.min(F.when(p, d)).alias("_first_purchase_recency"),
        F.max(F.when(p, d)).alias("_oldest_purchase_days"),
        F.sum(F.when(p, F.col("amount")).otherwise(0.0)).alias("purchase_amount_total"),
        F.avg(F.when(p, F.col("quantity").cast("double"))).alias("_basket"),
    ]
    for w in WINDOWS_DAYS:
        in_w = d < float(w)
        aggs.append(F.sum((p & in_w).cast("double")).alias(f"purchases_{w}d"))
        aggs.append(F.sum(F.when(p & in_w, F.col("amount")).otherwise(0.0)).alias(f"amount_{w}d"))
        if "event_type" in available_columns:
            aggs.append(F.sum(in_w.cast("double")).alias(f"events_{w}d"))
    if "event_type" in available_columns:
        for t in EVENT_TYPE_MIX:
            aggs.append(F.avg((F.col("event_type") == t).cast("double")).alias(f"share_{t}"))
    if "category" in available_columns:
        aggs.append(F.count_distinct("category").cast("double").alias("n_categories"))
    if "channel" in available_columns:
        aggs.append(F.count_distinct("channel").cast("double").alias("n_channels"))

    n_p = F.col("n_purchases")
    out = past.groupBy("customer_id").agg(*aggs)
    out = (
        out.withColumn(
            "purchase_recency_days",
            F.coalesce(F.col("_first_purchase_recency"), F.lit(NO_PURCHASE_DAYS)),
        )
        .withColumn(
            "purchase_amount_mean",
            F.when(n_p > 0, F.col("purchase_amount_total") / n_p).otherwise(0.0),
        )
        .withColumn(
            "mean_interpurchase_days",
            F.when(
                n_p > 1,
                (F.col("_oldest_purchase_days") - F.col("_first_purchase_recency")) / (n_p - 1),
            ).otherwise(NO_PURCHASE_DAYS),
        )
        .withColumn("basket_size_mean", F.coalesce(F.col("_basket"), F.lit(0.0)))
        .withColumn(
            "trend_30d_vs_365d",
            (F.col("purchases_30d") * (365 / 30)) / (F.col("purchases_365d") + 1.0),
        )
        .withColumn(
            "trend_90d_vs_365d",
            (F.col("purchases_90d") * (365 / 90)) / (F.col("purchases_365d") + 1.0),
        )
    )
    return out.select(
        "customer_id", *[F.col(n).cast("double") for n in feature_names(available_columns)]
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


def _as_naive_utc(value: dt.datetime) -> dt.datetime:
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value


def end_of_day(day: dt.date) -> dt.datetime:
    """The as-of instant for a date: the last microsecond of that UTC day (naive)."""
    return dt.datetime.combine(day, dt.time.max)
