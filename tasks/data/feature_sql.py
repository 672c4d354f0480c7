"""The features as SQL that both engines run: Spark SQL (:mod:`tasks.data.features`) and DuckDB
(:mod:`tasks.data.features_duckdb`) compute them from this one text.

:func:`wide_sql` is one row per customer with every cutoff's aggregates: one group-by of
conditional aggregates over the customer's events; the gaps between purchases from one window
over the purchases; and, per mix column, the counts per (customer, value) aggregated again per
customer. The branches are grouped by customer and joined on it (a shuffled hash join, hinted
for Spark; a comment to DuckDB), so events clustered by customer are never shuffled.
:func:`cutoff_sql` selects a cutoff's customers and computes its features from the aggregates
by the formulas of :mod:`tasks.definitions.feature_formulas`. Only the prepared input differs by
engine: ``customer_id``, the event time as integer microseconds ``_t``, the purchase flag
``_p``, ``amount``, the quantity as a double ``_q``, ``event_type`` and the mix columns.

Only the constructs both engines parse the same way are used: ``x::DOUBLE`` (every
non-integer literal is a double; a bare ``1.5`` would be a decimal), ``ln``, ``greatest``,
``coalesce``, ``CASE`` (also for conditional aggregates), ``lag`` and ``USING`` joins.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tasks.data.cutoffs import Cutoff, micros
from tasks.data.sequences import CUTOFF as SEQ_CUTOFF
from tasks.data.sequences import EVENTS as SEQ_EVENTS
from tasks.definitions.examples import EVENT_TYPE_CODES, ORIGIN, OTHER_EVENT_TYPE
from tasks.definitions.feature_formulas import feature_values
from tasks.definitions.feature_specs import DAY_MICROS, EVENT_TYPE_MIX, WINDOWS_DAYS, feature_names

_SIMPLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def identifier(name: str) -> str:
    """``name`` as a column name both engines read unquoted; anything else is refused (every
    name here comes from the code: cutoffs, aggregates, features, contract columns)."""
    if not _SIMPLE_NAME.fullmatch(name):
        raise ValueError(f"not a plain SQL name: {name!r}")
    return name


def _col(cutoff: Cutoff, name: str) -> str:
    return identifier(f"{cutoff.name}__{name}")


def _agg(fn: str, cutoff: Cutoff, condition: str, value: str, name: str) -> str:
    return f"{_conditional(fn, condition, value)} AS {_col(cutoff, name)}"


def _conditional(fn: str, condition: str, value: str) -> str:
    """The aggregate ``fn`` of ``value`` (``*``: rows) over the rows where ``condition`` holds,
    as ``fn(CASE WHEN condition THEN value END)``: what ``fn(value) FILTER (WHERE condition)``
    gives (aggregates skip nulls; ``count`` is 0 and the others null without such a row), at
    half DuckDB's time for the ~75 aggregates of three cutoffs (its ``FILTER`` runs each
    aggregate over a selection of its own)."""
    return f"{fn}(CASE WHEN {condition} THEN {'1' if value == '*' else value} END)"


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
        future = f"_t > {c} AND _t <= {micros(cutoff.label_until)} AND _p"
        aggs.append(_agg("max", cutoff, future, _literal(1.0), "_label"))
    return aggs


def wide_sql(
    source: str,
    cutoffs: Sequence[Cutoff],
    mix_columns: Sequence[str],
    sequences: SequenceSql | None = None,
) -> str:
    """One row per customer of ``source`` (the prepared events, see the module's docstring):
    ``events_after`` (events after the latest cutoff) and every cutoff's aggregates
    (``<cutoff>__<aggregate>``), with the mix aggregates of ``mix_columns``; with ``sequences``
    also the events of :func:`sequence_branch` (``_seq_events``)."""
    if not cutoffs or len({c.name for c in cutoffs}) != len(cutoffs):
        raise ValueError(f"cutoffs need distinct names, got {[c.name for c in cutoffs]}")
    latest = max(c.micros() for c in cutoffs)
    events = [f"{_conditional('count', f'_t > {latest}', '*')} AS events_after"]
    gaps: list[str] = []
    mixes: dict[str, list[str]] = {identifier(col): [] for col in mix_columns}
    for cutoff in cutoffs:
        events += _event_aggregates(cutoff)
        past = f"_t <= {cutoff.micros()}"
        gaps += [
            _agg("avg", cutoff, past, "_gap", "_gap_mean"),
            _agg("stddev_pop", cutoff, past, "_gap", "_gap_std"),
            _agg("max", cutoff, past, "_gap", "_gap_max"),
        ]
        n = identifier(cutoff.name)
        for col, aggs in mixes.items():
            aggs += [
                _agg("count", cutoff, f"{n} > 0", "*", f"_{col}_values"),
                f"max({n}) AS {_col(cutoff, f'_{col}_top')}",
                f"sum({n})::DOUBLE AS {_col(cutoff, f'_{col}_total')}",
                _agg("sum", cutoff, f"{n} > 0", f"{n} * ln({n})", f"_{col}_clogc"),
            ]
    per_value = ", ".join(
        f"{_conditional('count', f'_t <= {c.micros()}', '*')} AS {identifier(c.name)}"
        for c in cutoffs
    )
    branches = {
        "gaps": f"""SELECT customer_id, {", ".join(gaps)}
  FROM (SELECT customer_id, _t,
               (_t - lag(_t) OVER (PARTITION BY customer_id ORDER BY _t)) / {_literal(DAY_MICROS)}
                 AS _gap
        FROM {source} WHERE _p)
  GROUP BY customer_id"""
    }
    for i, (col, aggs) in enumerate(mixes.items()):
        branches[f"mix_{i}"] = f"""SELECT customer_id, {", ".join(aggs)}
  FROM (SELECT customer_id, {per_value} FROM {source}
        WHERE {col} IS NOT NULL GROUP BY customer_id, {col})
  GROUP BY customer_id"""
    if sequences is not None and sequences.length > 0:
        branches["seq"] = sequence_branch(source, cutoffs, list(mixes), sequences)
    joins = "\n".join(
        f"LEFT JOIN ({sql}) AS {name} USING (customer_id)" for name, sql in branches.items()
    )
    return f"""SELECT /*+ SHUFFLE_HASH({", ".join(branches)}) */ * FROM
(SELECT customer_id, {", ".join(events)} FROM {source} GROUP BY customer_id) AS events
{joins}"""


@dataclass(frozen=True)
class SequenceSql:
    """The last ``length`` events per customer and cutoff, in an engine's SQL (``dialect``:
    the one construct that differs, a struct with named fields)."""

    length: int
    dialect: Literal["spark", "duckdb"]

    def struct(self, fields: dict[str, str]) -> str:
        """A struct of the named expressions."""
        if self.dialect == "spark":
            return "named_struct(" + ", ".join(f"'{k}', {v}" for k, v in fields.items()) + ")"
        return "struct_pack(" + ", ".join(f"{k} := {v}" for k, v in fields.items()) + ")"


def sequence_branch(
    source: str, cutoffs: Sequence[Cutoff], mixes: list[str], sequences: SequenceSql
) -> str:
    """Per customer, every event among the ``length`` latest before one of ``cutoffs``, as a
    list of structs ``_seq_events`` (rank ``i`` in the customer's history, time ``t``,
    ``amount``, event-type code ``k``, the raw mix values), in no order:
    :func:`tasks.data.sequences.pad_sequences` picks each cutoff's and orders them. The rank
    orders by time, then by every other column (nulls first), so both engines rank ties alike;
    an event ``i`` is among the ``N`` latest before cutoff ``c`` when ``0 <= n_c - i < N``,
    ``n_c`` the customer's events at or before ``c``."""
    latest = max(c.micros() for c in cutoffs)
    tiebreak = ["event_type", "amount", "_q", *mixes]
    order = ", ".join(["_t", *(f"{c} NULLS FIRST" for c in tiebreak)])
    counts = [
        f"sum(CASE WHEN _t <= {c.micros()} THEN 1 ELSE 0 END) OVER (PARTITION BY customer_id) "
        f"AS _n{j}"
        for j, c in enumerate(cutoffs)
    ]
    kept = " OR ".join(
        f"(_n{j} - _i BETWEEN 0 AND {sequences.length - 1})" for j in range(len(cutoffs))
    )
    kinds = " ".join(f"WHEN '{k}' THEN {v}" for k, v in EVENT_TYPE_CODES.items())
    fields = {
        "i": "_i",
        "t": "_t",
        "amount": "amount",
        "k": f"CASE event_type {kinds} ELSE {OTHER_EVENT_TYPE} END",
        **{identifier(col): col for col in mixes},
    }
    columns = ", ".join(["customer_id", "_t", "amount", "event_type", *mixes])
    return f"""SELECT customer_id, array_agg({sequences.struct(fields)}) AS {SEQ_EVENTS}
  FROM (SELECT {columns},
               row_number() OVER (PARTITION BY customer_id ORDER BY {order}) AS _i,
               {", ".join(counts)}
        FROM {source} WHERE _t <= {latest})
  WHERE {kept}
  GROUP BY customer_id"""


@dataclass(frozen=True)
class Sql:
    """A SQL expression with the arithmetic the formulas use (each operation parenthesised,
    numbers as literals)."""

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
    """An int as an integer literal, a float as a DOUBLE."""
    return repr(value) if isinstance(value, int) else f"{value!r}::DOUBLE"


class SqlOps:
    """The formulas' operations (:class:`tasks.definitions.feature_formulas.Ops`) as SQL over a
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


def seen_condition(cutoff: Cutoff) -> str:
    """True for the customers of :func:`wide_sql`'s table with an event at or before ``cutoff``."""
    return f"{_col(cutoff, '_last_t')} IS NOT NULL"


def cutoff_columns(
    cutoff: Cutoff, available_columns: set[str], sequences: bool = False
) -> list[str]:
    """``customer_id``, the features at ``cutoff`` (doubles, by
    :func:`tasks.definitions.feature_formulas.feature_values`), for a labelled cutoff ``label``,
    and with ``sequences`` the wide table's ``_seq_events`` and the cutoff (``_seq_cutoff``)
    that :func:`tasks.data.sequences.pad_sequences` turns into the sequence columns."""
    ops = SqlOps(cutoff)
    values = feature_values(ops, cutoff.micros())
    columns = ["customer_id"]
    columns += [
        f"CAST({values[n]} AS DOUBLE) AS {identifier(n)}" for n in feature_names(available_columns)
    ]
    if cutoff.label_until is not None:
        columns.append(f"coalesce({ops.agg('_label')}, {_literal(0.0)}) AS label")
    if sequences:
        columns += [SEQ_EVENTS, f"{cutoff.micros()} AS {SEQ_CUTOFF}"]
    return columns


def cutoff_sql(
    wide: str, cutoff: Cutoff, available_columns: set[str], sequences: bool = False
) -> str:
    """The customers seen at ``cutoff`` in :func:`wide_sql`'s table ``wide``: their
    :func:`cutoff_columns`."""
    columns = ", ".join(cutoff_columns(cutoff, available_columns, sequences))
    return f"SELECT {columns} FROM {wide} WHERE {seen_condition(cutoff)}"


def origin_column(cutoff: Cutoff) -> str:
    """The example's origin (the day of its labelled cutoff) as a DATE column ``origin``."""
    return f"DATE '{cutoff.origin().isoformat()}' AS {ORIGIN}"


def examples_sql(
    wide: str, origins: Sequence[Cutoff], available_columns: set[str], sequences: bool = False
) -> str:
    """The training examples of the labelled cutoffs ``origins`` in :func:`wide_sql`'s table
    ``wide``: at each, the customers seen by it with their :func:`cutoff_columns` and its
    ``origin``; a customer seen at several origins is an example at each of them."""
    if not origins or any(c.label_until is None for c in origins):
        raise ValueError(f"examples need labelled cutoffs, got {[c.name for c in origins]}")
    return "\nUNION ALL\n".join(
        f"SELECT {', '.join([*cutoff_columns(c, available_columns, sequences), origin_column(c)])} "
        f"FROM {wide} WHERE {seen_condition(c)}"
        for c in origins
    )
