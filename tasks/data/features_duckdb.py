"""The features of :mod:`tasks.data.features` computed by DuckDB in this process, for event sets
that fit one machine comfortably (a Spark job costs more than their rows).

Same definitions, same structure: one group-by of conditional aggregates per customer for every
cutoff, the gaps between purchases from one window over the purchases, and per mix column the
counts per (customer, value) aggregated again per customer; the features at a cutoff are
expressions over that wide table. Event times are compared as integer microseconds, as in Spark,
so a feature is the same number in both engines (``tests/unit/tasks/data/test_features_duckdb.py``
checks them against each other).
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from tasks.data.feature_specs import (
    DAY_MICROS,
    EVENT_TYPE_MIX,
    MIX_COLUMNS,
    NO_PURCHASE_DAYS,
    WINDOWS_DAYS,
    feature_names,
)
from tasks.data.features import Cutoff

EVENT_COLUMNS = ("customer_id", "event_time", "amount", "event_type", "quantity", *MIX_COLUMNS)


class InProcessFeatures:
    """The wide per-customer table of ``cutoffs`` over ``events`` (an Arrow table with the
    contract's columns), from which each cutoff's features are selected; :meth:`close` it."""

    def __init__(
        self, events: pa.Table, cutoffs: Sequence[Cutoff], available_columns: set[str]
    ) -> None:
        if not cutoffs or len({c.name for c in cutoffs}) != len(cutoffs):
            raise ValueError(f"cutoffs need distinct names, got {[c.name for c in cutoffs]}")
        self.available_columns = set(available_columns)
        self._con = duckdb.connect()
        self._con.register("prepared", _prepared(events))
        self._con.execute(f"CREATE TEMP TABLE wide AS {wide_sql('prepared', cutoffs)}")

    def cutoff_table(self, cutoff: Cutoff) -> pa.Table:
        """The customers seen at ``cutoff``: ``customer_id``, the features (doubles) and, for a
        labelled cutoff, ``label``; ordered by customer, so the output never depends on threads."""
        query = f"{cutoff_sql('wide', cutoff, self.available_columns)} ORDER BY customer_id"
        return self._con.sql(query).to_arrow_table()

    def events_after(self) -> int:
        """Events after the latest cutoff (ignored by every feature)."""
        rows = self._con.execute("SELECT sum(events_after)::BIGINT FROM wide").fetchall()
        return int(rows[0][0] or 0)

    def close(self) -> None:
        """Free DuckDB's copy of the wide table."""
        self._con.close()

    def __enter__(self) -> InProcessFeatures:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _prepared(events: pa.Table) -> pa.Table:
    """The columns the aggregates use: event time as integer microseconds (``_t``), a purchase
    flag (``_p``) and the quantity as a double (``_q``)."""
    time = events["event_time"]
    micros = time.cast(pa.timestamp("us", time.type.tz), safe=False).cast(pa.int64())
    return pa.table(
        {
            "customer_id": events["customer_id"],
            "_t": micros,
            "_p": pc.equal(events["event_type"], "purchase"),
            "amount": events["amount"].cast(pa.float64()),
            "_q": events["quantity"].cast(pa.float64()),
            "event_type": events["event_type"],
            **{c: events[c] for c in MIX_COLUMNS},
        }
    )


def _q(name: str) -> str:
    return f'"{name}"'


def _col(cutoff: Cutoff, name: str) -> str:
    return _q(f"{cutoff.name}__{name}")


def _agg(fn: str, cutoff: Cutoff, condition: str, value: str, name: str) -> str:
    return f"{fn}({value}) FILTER (WHERE {condition}) AS {_col(cutoff, name)}"


def _event_aggregates(cutoff: Cutoff) -> list[str]:
    c = cutoff.micros()
    past = f"_t <= {c}"
    bought = f"{past} AND _p"
    aggs = [
        _agg("max", cutoff, past, "_t", "_last_t"),
        _agg("min", cutoff, past, "_t", "_first_t"),
        _agg("count", cutoff, bought, "*", "_n_p"),
        _agg("max", cutoff, bought, "_t", "_last_p_t"),
        _agg("sum", cutoff, bought, "amount", "_amount"),
        _agg("avg", cutoff, bought, "_q", "_basket_mean"),
        _agg("max", cutoff, bought, "_q", "_basket_max"),
        _agg("count", cutoff, past, "*", "_n"),
    ]
    for w in WINDOWS_DAYS:
        recent = f"{past} AND _t > {c - int(w * DAY_MICROS)}"
        aggs += [
            _agg("count", cutoff, f"{recent} AND _p", "*", f"_n_p_{w}"),
            _agg("sum", cutoff, f"{recent} AND _p", "amount", f"_amount_{w}"),
            _agg("count", cutoff, recent, "*", f"_n_{w}"),
        ]
    for kind in EVENT_TYPE_MIX:
        aggs.append(_agg("count", cutoff, f"{past} AND event_type = '{kind}'", "*", f"_n_{kind}"))
    if cutoff.label_until is not None:
        future = f"_t > {c} AND _t <= {Cutoff('until', cutoff.label_until).micros()} AND _p"
        aggs.append(_agg("max", cutoff, future, "1.0::DOUBLE", "_label"))
    return aggs


def wide_sql(source: str, cutoffs: Sequence[Cutoff]) -> str:
    """One row per customer of ``source`` (see :func:`_prepared`): ``events_after`` and every
    cutoff's aggregates (``<cutoff>__<aggregate>``)."""
    latest = max(c.micros() for c in cutoffs)
    events = [f"count(*) FILTER (WHERE _t > {latest}) AS events_after"]
    gaps, mixes = [], {col: [] for col in MIX_COLUMNS}
    for cutoff in cutoffs:
        events += _event_aggregates(cutoff)
        past = f"_t <= {cutoff.micros()}"
        gaps += [
            _agg("avg", cutoff, past, "_gap", "_gap_mean"),
            _agg("stddev_pop", cutoff, past, "_gap", "_gap_std"),
            _agg("max", cutoff, past, "_gap", "_gap_max"),
        ]
        n = _q(cutoff.name)
        for col in MIX_COLUMNS:
            mixes[col] += [
                _agg("count", cutoff, f"{n} > 0", "*", f"_{col}_values"),
                f"max({n}) AS {_col(cutoff, f'_{col}_top')}",
                f"sum({n})::DOUBLE AS {_col(cutoff, f'_{col}_total')}",
                _agg("sum", cutoff, f"{n} > 0", f"{n} * ln({n})", f"_{col}_clogc"),
            ]
    per_value = ", ".join(
        f"count(*) FILTER (WHERE _t <= {c.micros()}) AS {_q(c.name)}" for c in cutoffs
    )
    branches = [
        f"""(SELECT customer_id, {", ".join(gaps)}
  FROM (SELECT customer_id, _t,
               (_t - lag(_t) OVER (PARTITION BY customer_id ORDER BY _t)) / {DAY_MICROS!r} AS _gap
        FROM {source} WHERE _p)
  GROUP BY customer_id)"""
    ]
    branches += [
        f"""(SELECT customer_id, {", ".join(aggs)}
  FROM (SELECT customer_id, {per_value} FROM {source}
        WHERE {col} IS NOT NULL GROUP BY customer_id, {col})
  GROUP BY customer_id)"""
        for col, aggs in mixes.items()
    ]
    joins = "\n".join(f"LEFT JOIN {b} USING (customer_id)" for b in branches)
    return f"""SELECT * FROM
(SELECT customer_id, {", ".join(events)} FROM {source} GROUP BY customer_id)
{joins}"""


def cutoff_sql(wide: str, cutoff: Cutoff, available_columns: set[str]) -> str:
    """The features of the customers seen at ``cutoff`` from :func:`wide_sql`'s table (and the
    label of a labelled cutoff): the expressions of :func:`tasks.data.features._cutoff_columns`."""
    c = cutoff.micros()

    def a(name: str) -> str:
        return _col(cutoff, name)

    def days(micros: str) -> str:
        return f"(({c} - {micros}) / {DAY_MICROS!r})"

    def safe_div(num: str, den: str) -> str:
        return f"(CASE WHEN {den} > 0 THEN {num} / {den} ELSE 0.0 END)"

    none = repr(NO_PURCHASE_DAYS)
    n_p = f"{a('_n_p')}::DOUBLE"
    amount = f"coalesce({a('_amount')}, 0.0)"
    last_purchase = f"coalesce({days(a('_last_p_t'))}, {none})"
    mean_gap = f"coalesce({a('_gap_mean')}, {none})"
    values = {
        "recency_days": days(a("_last_t")),
        "tenure_days": days(a("_first_t")),
        "n_purchases": n_p,
        "purchase_recency_days": last_purchase,
        "purchase_amount_total": amount,
        "purchase_amount_mean": safe_div(amount, n_p),
        "mean_interpurchase_days": mean_gap,
        "std_interpurchase_days": f"coalesce({a('_gap_std')}, 0.0)",
        "max_interpurchase_days": f"coalesce({a('_gap_max')}, {none})",
        "purchase_recency_over_gap": f"({last_purchase} / greatest({mean_gap}, 1.0))",
        "basket_size_mean": f"coalesce({a('_basket_mean')}, 0.0)",
        "basket_size_max": f"coalesce({a('_basket_max')}, 0.0)",
    }
    for w in WINDOWS_DAYS:
        amount_w = f"coalesce({a(f'_amount_{w}')}, 0.0)"
        values[f"purchases_{w}d"] = f"{a(f'_n_p_{w}')}::DOUBLE"
        values[f"amount_{w}d"] = amount_w
        values[f"amount_mean_{w}d"] = safe_div(amount_w, a(f"_n_p_{w}"))
        values[f"events_{w}d"] = f"{a(f'_n_{w}')}::DOUBLE"
    values["trend_30d_vs_365d"] = (
        f"(({values['purchases_30d']} * {365 / 30!r}) / ({values['purchases_365d']} + 1))"
    )
    values["trend_90d_vs_365d"] = (
        f"(({values['purchases_90d']} * {365 / 90!r}) / ({values['purchases_365d']} + 1))"
    )
    values["trend_amount_90d_vs_365d"] = (
        f"(({values['amount_90d']} * {365 / 90!r}) / ({values['amount_365d']} + 1.0))"
    )
    n = f"{a('_n')}::DOUBLE"
    values["n_events"] = n
    values["share_purchase"] = safe_div(n_p, n)
    for kind in EVENT_TYPE_MIX:
        values[f"share_{kind}"] = safe_div(a(f"_n_{kind}"), n)
    for col, plural in MIX_COLUMNS.items():
        total = f"coalesce({a(f'_{col}_total')}, 0.0)"
        values[f"n_{plural}"] = f"coalesce({a(f'_{col}_values')}, 0)::DOUBLE"
        values[f"top_{col}_share"] = safe_div(a(f"_{col}_top"), total)
        values[f"{col}_entropy"] = (
            f"(CASE WHEN {total} > 0 THEN ln({total}) - {a(f'_{col}_clogc')} / {total} "
            "ELSE 0.0 END)"
        )
    columns = ["customer_id"]
    columns += [f"({values[n]})::DOUBLE AS {_q(n)}" for n in feature_names(available_columns)]
    if cutoff.label_until is not None:
        columns.append(f"coalesce({a('_label')}, 0.0) AS label")
    return f"SELECT {', '.join(columns)} FROM {wide} WHERE {a('_last_t')} IS NOT NULL"
