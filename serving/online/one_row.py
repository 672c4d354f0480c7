"""One customer's aggregates and features straight from its record: one generated Python
function per feature list and cutoff, from what a request reads (:meth:`OnlineState.read_row`:
the record's fields as a tuple, its window sums, its mix counts) to the features, with the
batch stage's formulas rendered by :class:`serving.online.scalar_formulas.PythonOps` (the one
definition) and each aggregate they read computed once, as a local variable, in between: no
dict of aggregates, no call per operation.

:data:`AGGREGATE_SOURCE` is each aggregate of
:data:`tasks.definitions.feature_formulas.AGGREGATES` as Python source over the read, the same
operations on the same doubles as :func:`serving.online.state._aggregates` does on arrays
(NaN for SQL's null).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence

from serving.online.events import NO_TIME
from serving.online.record import POSITION
from serving.online.scalar_formulas import HELPERS, features_source
from tasks.definitions.feature_formulas import AGGREGATES
from tasks.definitions.feature_specs import EVENT_TYPE_MIX, MIX_COLUMNS, WINDOWS_DAYS

# a read: v the record's fields (serving.online.record.Record.unpack), s the window sums
# ([events, purchases, amount], each over WINDOWS_DAYS), m each mix column's counts per value
RowFeatures = Callable[[tuple, list[list[float]], Sequence[tuple[int, ...]]], tuple[float, ...]]
RowAggregates = Callable[[tuple, list[list[float]], Sequence[tuple[int, ...]]], dict[str, float]]


def _field(name: str) -> str:
    return f"v[{POSITION[name]}]"


def _present(j: int) -> str:
    """The local holding the counts above zero of mix column ``j``."""
    return f"m{j}"


def _aggregate_source() -> dict[str, str]:
    n_p = _field("n_p")
    last_t, last_p_t = _field("last_t"), _field("last_p_t")
    a = {
        "_last_t": f"(nan if {last_t} == NO_TIME else float({last_t}))",
        "_first_t": f"float({_field('first_t')})",
        "_n": f"float({_field('n')})",
        "_n_p": f"float({n_p})",
        "_last_p_t": f"(nan if {last_p_t} == NO_TIME else float({last_p_t}))",
        "_amount": f"({_field('amount')} if {n_p} > 0 else nan)",
        "_basket_mean": f"({_field('q_sum')} / {n_p} if {n_p} > 0 else nan)",
        "_basket_max": f"({_field('q_max')} if {n_p} > 0 else nan)",
        "_gap_mean": f"({_field('gap_mean')} if {n_p} > 1 else nan)",
        "_gap_std": f"(sqrt(max({_field('gap_m2')}, 0.0) / ({n_p} - 1)) if {n_p} > 1 else nan)",
        "_gap_max": f"({_field('gap_max')} if {n_p} > 1 else nan)",
    }
    for k, w in enumerate(WINDOWS_DAYS):
        a[f"_n_{w}"] = f"s[0][{k}]"
        a[f"_n_p_{w}"] = f"s[1][{k}]"
        a[f"_amount_{w}"] = f"(s[2][{k}] if s[1][{k}] > 0 else nan)"
    for kind in EVENT_TYPE_MIX:
        a[f"_n_{kind}"] = f"float({_field(f'n_{kind}')})"
    for j, col in enumerate(MIX_COLUMNS):
        c = _present(j)
        a[f"_{col}_values"] = f"float(len({c}))"
        a[f"_{col}_top"] = f"float(max({c}, default=0))"
        a[f"_{col}_total"] = f"float(sum({c}))"
        a[f"_{col}_clogc"] = f"(sum([c * log(c) for c in {c}]) if {c} else nan)"
    return a


AGGREGATE_SOURCE: dict[str, str] = _aggregate_source()
_SCOPE = {**HELPERS, "nan": math.nan, "sqrt": math.sqrt, "log": math.log, "NO_TIME": NO_TIME}


def _local(name: str) -> str:
    return f"a{name}"  # aggregates' names start with "_"


def _function(name: str, needed: Sequence[str], result: str) -> Callable:
    """Compile ``def name(v, s, m)`` computing the aggregates ``needed`` as locals, then
    returning ``result``."""
    lines = [f"def {name}(v, s, m):"]
    mix_used = sorted(
        {j for j, col in enumerate(MIX_COLUMNS) for a in needed if a.startswith(f"_{col}_")}
    )
    lines += [f"    {_present(j)} = [c for c in m[{j}] if c]" for j in mix_used]
    lines += [f"    {_local(a)} = {AGGREGATE_SOURCE[a]}" for a in needed]
    lines.append(f"    return {result}")
    scope = dict(_SCOPE)
    exec(compile("\n".join(lines) + "\n", f"<{name}>", "exec"), scope)
    return scope[name]


@functools.lru_cache(maxsize=16)
def _compiled_features(names: tuple[str, ...], cutoff_micros: int) -> RowFeatures:
    texts = features_source(names, cutoff_micros, _local)
    used = re.compile(r"\b(a_\w+)\b")
    needed = {m[1:] for text in texts for m in used.findall(text)}
    listed = "".join(f"\n        {text}," for text in texts)
    order = [a for a in AGGREGATES if a in needed]
    return _function("features", order, f"({listed}\n    )")


def row_features(names: Sequence[str], cutoff_micros: int) -> RowFeatures:
    """A function of one customer's read giving its features ``names`` at the cutoff
    ``cutoff_micros``, in that order (compiled once per names and cutoff: a cutoff is a day's
    end, so once a day)."""
    return _compiled_features(tuple(names), cutoff_micros)


@functools.cache
def row_aggregates() -> RowAggregates:
    """A function of one customer's read giving every aggregate of
    :data:`tasks.definitions.feature_formulas.AGGREGATES` as a Python float."""
    listed = "".join(f"\n        {a!r}: {_local(a)}," for a in AGGREGATES)
    return _function("aggregates", list(AGGREGATES), f"{{{listed}\n    }}")
