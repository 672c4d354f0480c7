"""The features of :mod:`tasks.data.features` computed by DuckDB in this process, for event sets
that fit one machine comfortably (a Spark job costs more than their rows).

Same aggregates, same structure: one group-by of conditional aggregates per customer for every
cutoff, the gaps between purchases from one window over the purchases, and per mix column the
counts per (customer, value) aggregated again per customer. The features at a cutoff are the
formulas of :mod:`tasks.data.feature_formulas` over that wide table, written as SQL. Event times
are compared as integer microseconds, as in Spark, so a feature is the same number in both
engines (``tests/unit/tasks/data/test_features_duckdb.py`` checks them against each other).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from infra.duckdb_session import duckdb_connection, parquet_files_sql, sql_identifier
from tasks.data.feature_formulas import feature_values
from tasks.data.feature_specs import (
    DAY_MICROS,
    EVENT_TYPE_MIX,
    MIX_COLUMNS,
    WINDOWS_DAYS,
    feature_names,
)
from tasks.data.features import Cutoff

EVENT_COLUMNS = ("customer_id", "event_time", "amount", "event_type", "quantity", *MIX_COLUMNS)


class InProcessFeatures:
    """The wide per-customer table of ``cutoffs`` over ``events`` (an Arrow table or stream, or
    Parquet files DuckDB reads itself, with the contract's columns), from which each cutoff's
    features are selected; :meth:`close` it. DuckDB keeps the events in its own memory-bounded
    storage (see :mod:`infra.duckdb_session`), so they are read once and never held in Arrow."""

    def __init__(
        self,
        events: pa.Table | pa.RecordBatchReader | Sequence[Path],
        cutoffs: Sequence[Cutoff],
        available_columns: set[str],
    ) -> None:
        if not cutoffs or len({c.name for c in cutoffs}) != len(cutoffs):
            raise ValueError(f"cutoffs need distinct names, got {[c.name for c in cutoffs]}")
        self.available_columns = set(available_columns)
        self._con = duckdb_connection()
        if isinstance(events, (pa.Table, pa.RecordBatchReader)):
            self._con.register("events_input", events)
            self._con.execute(f"CREATE TEMP TABLE prepared AS {prepared_sql('events_input')}")
            self._con.unregister("events_input")
        else:
            prepared = prepared_sql(parquet_files_sql(events))
            self._con.execute(f"CREATE TEMP TABLE prepared AS {prepared}")
        self._con.execute(f"CREATE TEMP TABLE wide AS {wide_sql('prepared', cutoffs)}")
        self._con.execute("DROP TABLE prepared")

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


def prepared_sql(events: str) -> str:
    """The columns the aggregates use, from the relation ``events``: event time as integer
    microseconds (``_t``), a purchase flag (``_p``) and the quantity as a double (``_q``)."""
    mixes = "".join(f", {c}" for c in MIX_COLUMNS)
    return f"""SELECT customer_id, epoch_us(event_time) AS _t, event_type = 'purchase' AS _p,
    CAST(amount AS DOUBLE) AS amount, CAST(quantity AS DOUBLE) AS _q, event_type{mixes}
    FROM {events}"""


def _col(cutoff: Cutoff, name: str) -> str:
    return sql_identifier(f"{cutoff.name}__{name}")


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
    """One row per customer of ``source`` (see :func:`prepared_sql`): ``events_after`` and every
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
        n = sql_identifier(cutoff.name)
        for col in MIX_COLUMNS:
            mixes[col] += [
                _agg("count", cutoff, f"{n} > 0", "*", f"_{col}_values"),
                f"max({n}) AS {_col(cutoff, f'_{col}_top')}",
                f"sum({n})::DOUBLE AS {_col(cutoff, f'_{col}_total')}",
                _agg("sum", cutoff, f"{n} > 0", f"{n} * ln({n})", f"_{col}_clogc"),
            ]
    per_value = ", ".join(
        f"count(*) FILTER (WHERE _t <= {c.micros()}) AS {sql_identifier(c.name)}" for c in cutoffs
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


@dataclass(frozen=True)
class Sql:
    """A DuckDB SQL expression with the arithmetic the formulas use (each operation
    parenthesised, numbers as literals)."""

    text: str

    def __str__(self) -> str:
        return self.text

    def _op(self, op: str, other: Sql | float) -> Sql:
        right = other.text if isinstance(other, Sql) else _literal(other)
        return Sql(f"({self.text} {op} {right})")

    def __add__(self, other: Sql | float) -> Sql:
        return self._op("+", other)

    def __sub__(self, other: Sql | float) -> Sql:
        return self._op("-", other)

    def __mul__(self, other: Sql | float) -> Sql:
        return self._op("*", other)

    def __truediv__(self, other: Sql | float) -> Sql:
        return self._op("/", other)


def _literal(value: float) -> str:
    """An int as an integer literal, a float as a DOUBLE (a bare ``1.5`` is a DECIMAL)."""
    return repr(value) if isinstance(value, int) else f"{value!r}::DOUBLE"


class SqlOps:
    """The formulas' operations (:class:`tasks.data.feature_formulas.Ops`) as SQL over a
    cutoff's aggregates in :func:`wide_sql`'s table."""

    def __init__(self, cutoff: Cutoff) -> None:
        self._cutoff = cutoff

    def agg(self, name: str) -> Sql:
        return Sql(_col(self._cutoff, name))

    def lit(self, value: float) -> Sql:
        return Sql(_literal(value))

    def coalesce(self, value: Sql, default: Sql) -> Sql:
        return Sql(f"coalesce({value}, {default})")

    def double(self, value: Sql) -> Sql:
        return Sql(f"CAST({value} AS DOUBLE)")

    def greatest(self, first: Sql, second: Sql) -> Sql:
        return Sql(f"greatest({first}, {second})")

    def log(self, value: Sql) -> Sql:
        return Sql(f"ln({value})")

    def if_positive(self, test: Sql, then: Sql, otherwise: Sql) -> Sql:
        return Sql(f"(CASE WHEN {test} > 0 THEN {then} ELSE {otherwise} END)")


def cutoff_sql(wide: str, cutoff: Cutoff, available_columns: set[str]) -> str:
    """The features of the customers seen at ``cutoff`` from :func:`wide_sql`'s table (and the
    label of a labelled cutoff), by :func:`tasks.data.feature_formulas.feature_values`."""
    ops = SqlOps(cutoff)
    values = feature_values(ops, cutoff.micros())
    columns = ["customer_id"]
    columns += [
        f"CAST({values[n]} AS DOUBLE) AS {sql_identifier(n)}"
        for n in feature_names(available_columns)
    ]
    if cutoff.label_until is not None:
        columns.append(f"coalesce({ops.agg('_label')}, 0.0::DOUBLE) AS label")
    return f"SELECT {', '.join(columns)} FROM {wide} WHERE {ops.agg('_last_t')} IS NOT NULL"
