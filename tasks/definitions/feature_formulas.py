"""Every feature's formula over its cutoff's aggregates, written once for every engine.

An engine computes the aggregates of :data:`AGGREGATES` per customer and cutoff
(:mod:`tasks.data.feature_sql` as SQL for Spark and DuckDB, :mod:`serving.online.state` from
the endpoint's per-customer state); :func:`feature_values` turns them into features through an
:class:`Ops` (:class:`tasks.data.feature_sql.SqlOps`, :class:`serving.online.features.ArrayOps`,
:class:`serving.online.scalar_formulas.PythonOps`).
The formulas use ``+ - * /`` between expressions and with numbers, which the engines'
expressions provide; :class:`serving.online.scalar_formulas.PythonOps` renders them as Python
source for one customer's floats, where ``x / 0.0`` raises: so every division by an expression
that can be zero stays in the ``then`` of :meth:`Ops.if_positive` (evaluated only where the
test is positive there, as in SQL's CASE).
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from tasks.definitions.feature_specs import (
    DAY_MICROS,
    EVENT_TYPE_MIX,
    MIX_COLUMNS,
    NO_PURCHASE_DAYS,
    WINDOWS_DAYS,
)

E = TypeVar("E")


def _aggregates() -> dict[str, str]:
    a = {
        "_last_t": "time of the last event (microseconds since the epoch)",
        "_first_t": "time of the first event",
        "_n": "events",
        "_n_p": "purchases",
        "_last_p_t": "time of the last purchase (null without one)",
        "_amount": "sum of purchase amounts (null without a purchase)",
        "_basket_mean": "mean quantity per purchase (null without one)",
        "_basket_max": "largest quantity of a purchase (null without one)",
        "_gap_mean": "mean days between consecutive purchases (null with fewer than 2)",
        "_gap_std": "population std of those gaps (null with fewer than 2)",
        "_gap_max": "longest of those gaps (null with fewer than 2)",
    }
    for w in WINDOWS_DAYS:
        a[f"_n_{w}"] = f"events in the {w} days up to the cutoff (time > cutoff - {w} days)"
        a[f"_n_p_{w}"] = f"purchases in those {w} days"
        a[f"_amount_{w}"] = "sum of their amounts (null without one)"
    for kind in EVENT_TYPE_MIX:
        a[f"_n_{kind}"] = f"events of type '{kind}'"
    for col in MIX_COLUMNS:
        a[f"_{col}_values"] = f"distinct non-null {col} values"
        a[f"_{col}_top"] = f"events of the most frequent {col} value"
        a[f"_{col}_total"] = f"events with a {col} (a double)"
        a[f"_{col}_clogc"] = f"sum of c * ln(c) over the counts c of each {col} value"
    return a


AGGREGATES: dict[str, str] = _aggregates()
"""Every aggregate the formulas read, per customer over the events at or before the cutoff;
the features of optional columns read those of their column only."""


class Ops(Protocol[E]):
    """What the formulas need from an engine's expressions."""

    def agg(self, name: str) -> E:
        """The cutoff's aggregate ``name``."""
        ...

    def lit(self, value: float) -> E:
        """A constant (an int stays integral, a float is a double)."""
        ...

    def coalesce(self, value: E, default: E) -> E: ...

    def double(self, value: E) -> E:
        """``value`` cast to a double."""
        ...

    def greatest(self, first: E, second: E) -> E: ...

    def log(self, value: E) -> E:
        """The natural logarithm."""
        ...

    def if_positive(self, test: E, then: E, otherwise: E) -> E:
        """``then`` where ``test > 0``, else ``otherwise``."""
        ...


def feature_values(ops: Ops[Any], cutoff_micros: int) -> dict[str, Any]:
    """Every feature at the cutoff ``cutoff_micros`` (microseconds since the epoch) as an
    expression of its aggregates; features of optional columns reference aggregates only an
    input with that column has, so select them by :func:`tasks.definitions.feature_specs.feature_names`.
    """
    a = ops.agg
    cutoff = ops.lit(cutoff_micros)

    def days(micros: Any) -> Any:
        return (cutoff - micros) / DAY_MICROS

    def safe_div(num: Any, den: Any) -> Any:
        return ops.if_positive(den, num / den, ops.lit(0.0))

    zero, none = ops.lit(0.0), ops.lit(NO_PURCHASE_DAYS)
    n_p = ops.double(a("_n_p"))
    amount = ops.coalesce(a("_amount"), zero)
    last_purchase = ops.coalesce(days(a("_last_p_t")), none)
    mean_gap = ops.coalesce(a("_gap_mean"), none)
    values = {
        "recency_days": days(a("_last_t")),
        "tenure_days": days(a("_first_t")),
        "n_purchases": n_p,
        "purchase_recency_days": last_purchase,
        "purchase_amount_total": amount,
        "purchase_amount_mean": safe_div(amount, n_p),
        "mean_interpurchase_days": mean_gap,
        "std_interpurchase_days": ops.coalesce(a("_gap_std"), zero),
        "max_interpurchase_days": ops.coalesce(a("_gap_max"), none),
        "purchase_recency_over_gap": last_purchase / ops.greatest(mean_gap, ops.lit(1.0)),
        "basket_size_mean": ops.coalesce(a("_basket_mean"), zero),
        "basket_size_max": ops.coalesce(a("_basket_max"), zero),
    }
    for w in WINDOWS_DAYS:
        amount_w = ops.coalesce(a(f"_amount_{w}"), zero)
        values[f"purchases_{w}d"] = ops.double(a(f"_n_p_{w}"))
        values[f"amount_{w}d"] = amount_w
        values[f"amount_mean_{w}d"] = safe_div(amount_w, a(f"_n_p_{w}"))
        values[f"events_{w}d"] = ops.double(a(f"_n_{w}"))
    values["trend_30d_vs_365d"] = (values["purchases_30d"] * (365 / 30)) / (
        values["purchases_365d"] + 1
    )
    values["trend_90d_vs_365d"] = (values["purchases_90d"] * (365 / 90)) / (
        values["purchases_365d"] + 1
    )
    values["trend_amount_90d_vs_365d"] = (values["amount_90d"] * (365 / 90)) / (
        values["amount_365d"] + 1.0
    )
    n = ops.double(a("_n"))
    values["n_events"] = n
    values["share_purchase"] = safe_div(n_p, n)  # n = 0: a customer not seen by the cutoff
    for kind in EVENT_TYPE_MIX:
        values[f"share_{kind}"] = safe_div(a(f"_n_{kind}"), n)
    for col, plural in MIX_COLUMNS.items():
        total = ops.double(ops.coalesce(a(f"_{col}_total"), ops.lit(0)))
        values[f"n_{plural}"] = ops.double(ops.coalesce(a(f"_{col}_values"), ops.lit(0)))
        values[f"top_{col}_share"] = safe_div(a(f"_{col}_top"), total)
        values[f"{col}_entropy"] = ops.if_positive(
            total, ops.log(total) - a(f"_{col}_clogc") / total, zero
        )
    return values
