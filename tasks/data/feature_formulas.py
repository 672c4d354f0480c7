"""Every feature's formula over its cutoff's aggregates, written once for both engines.

:mod:`tasks.data.feature_sql` computes the aggregates per customer and cutoff (``_last_t``,
``_n_p``, ``_amount_30``, ...); :func:`feature_values` turns them into features through an
:class:`Ops`, there :class:`tasks.data.feature_sql.SqlOps`. The formulas use ``+ - * /`` between
expressions and with numbers, which its SQL expressions add.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from tasks.data.feature_specs import (
    DAY_MICROS,
    EVENT_TYPE_MIX,
    MIX_COLUMNS,
    NO_PURCHASE_DAYS,
    WINDOWS_DAYS,
)

E = TypeVar("E")


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
    input with that column has, so select them by :func:`tasks.data.feature_specs.feature_names`.
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
