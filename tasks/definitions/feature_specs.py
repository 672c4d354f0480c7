"""Every feature, declared once: its name, the optional input column it needs, its meaning.

:func:`feature_names` gives the features an input with a given set of columns gets; their
formulas are :mod:`tasks.definitions.feature_formulas`, computed by the SQL of
:mod:`tasks.data.feature_sql` (Spark and DuckDB) and by the endpoint's online state
(:mod:`serving.online`); docs/data-contract.md lists them (a test checks that every name is
documented).
"""

from __future__ import annotations

from dataclasses import dataclass

WINDOWS_DAYS: tuple[int, ...] = (7, 30, 90, 180, 365)
NO_PURCHASE_DAYS = 3650.0  # recency/gap stand-in for "never purchased"
EVENT_TYPE_MIX: tuple[str, ...] = ("view", "add_to_cart", "return")
MIX_COLUMNS: dict[str, str] = {"category": "categories", "channel": "channels"}
SECONDS_PER_DAY = 86_400.0
DAY_MICROS = SECONDS_PER_DAY * 1e6


def present_mix_columns(available_columns: set[str]) -> list[str]:
    """The mix columns (:data:`MIX_COLUMNS`) an input with ``available_columns`` has."""
    return [c for c in MIX_COLUMNS if c in available_columns]


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
