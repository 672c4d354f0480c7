"""The batch stage's formulas (:func:`tasks.definitions.feature_formulas.feature_values`) as one
Python function of one customer's aggregates (a dict of Python floats, NaN for SQL's null):
what a request reads. :class:`PythonOps` renders the formulas to Python source, as
:class:`tasks.data.feature_sql.SqlOps` renders them to SQL, and the source is compiled once per
feature list and cutoff; evaluating it costs a few microseconds where calling the operations
one by one costs tens.

A division by an expression that can be zero is in the ``then`` of ``if_positive``, which
becomes Python's conditional expression: evaluated only when the test is positive, so no
division raises (``x / 0.0`` does in Python; numpy gives inf or NaN, which the formulas never
keep).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

from tasks.definitions.feature_formulas import feature_values

Features = Callable[[dict[str, float]], tuple[float, ...]]


class PythonExpr:
    """A Python expression over the aggregates ``a`` (each operation parenthesised, numbers as
    float literals)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def _op(self, op: str, other: PythonExpr | float) -> PythonExpr:
        right = other.text if isinstance(other, PythonExpr) else _literal(other)
        return PythonExpr(f"({self.text} {op} {right})")

    def __add__(self, other: PythonExpr | float) -> PythonExpr:
        return self._op("+", other)

    def __sub__(self, other: PythonExpr | float) -> PythonExpr:
        return self._op("-", other)

    def __mul__(self, other: PythonExpr | float) -> PythonExpr:
        return self._op("*", other)

    def __truediv__(self, other: PythonExpr | float) -> PythonExpr:
        return self._op("/", other)


def _literal(value: float) -> str:
    number = float(value)  # an int too: the arrays' literals are doubles
    if not math.isfinite(number):
        raise ValueError(f"no literal for {value!r}")
    return repr(number)  # repr reads back as the same double


class PythonOps:
    """The formulas' operations (:class:`tasks.definitions.feature_formulas.Ops`) as Python
    source on floats, with :class:`serving.online.features.ArrayOps`'s semantics: NaN for
    null, greatest skipping NaN, log(0) = -inf. An aggregate is ``a[name]`` (a dict of them),
    or what ``aggregate`` renders for its name (a local variable of the generated function)."""

    def __init__(self, aggregate: Callable[[str], str] | None = None) -> None:
        self._aggregate = aggregate

    def agg(self, name: str) -> PythonExpr:
        if self._aggregate is not None:
            return PythonExpr(self._aggregate(name))
        return PythonExpr(f"a[{name!r}]")

    def lit(self, value: float) -> PythonExpr:
        return PythonExpr(_literal(value))

    def coalesce(self, value: PythonExpr, default: PythonExpr) -> PythonExpr:
        if value.text.isidentifier():  # a local: read twice, not worth a call
            return PythonExpr(f"({default.text} if {value.text} != {value.text} else {value.text})")
        return PythonExpr(f"_coalesce({value.text}, {default.text})")

    def double(self, value: PythonExpr) -> PythonExpr:
        return value  # every aggregate and literal is a float already

    def greatest(self, first: PythonExpr, second: PythonExpr) -> PythonExpr:
        return PythonExpr(f"_greatest({first.text}, {second.text})")

    def log(self, value: PythonExpr) -> PythonExpr:
        return PythonExpr(f"_log({value.text})")

    def if_positive(self, test: PythonExpr, then: PythonExpr, otherwise: PythonExpr) -> PythonExpr:
        return PythonExpr(f"({then.text} if {test.text} > 0 else {otherwise.text})")


def _coalesce(value: float, default: float) -> float:
    return default if value != value else value  # NaN is the one value unequal to itself


def _greatest(first: float, second: float) -> float:
    if first != first:  # SQL's greatest skips nulls, as np.fmax does
        return second
    return first if second != second or first >= second else second


def _log(value: float) -> float:
    return math.log(value) if value > 0 else (-math.inf if value == 0 else math.nan)


HELPERS: dict[str, object] = {"_coalesce": _coalesce, "_greatest": _greatest, "_log": _log}
"""What the rendered source calls, for the scope it is compiled in."""


def features_source(
    names: Sequence[str], cutoff_micros: int, aggregate: Callable[[str], str] | None = None
) -> list[str]:
    """The Python source of each of features ``names`` at the cutoff (:class:`PythonOps`,
    ``aggregate`` rendering the aggregates)."""
    values = feature_values(PythonOps(aggregate), cutoff_micros)
    return [values[name].text for name in names]


@functools.lru_cache(maxsize=16)
def _compiled(names: tuple[str, ...], cutoff_micros: int) -> Features:
    listed = "".join(f"\n        {text}," for text in features_source(names, cutoff_micros))
    source = f"def features(a):\n    return ({listed}\n    )\n"
    scope = dict(HELPERS)
    exec(compile(source, f"<features at {cutoff_micros}>", "exec"), scope)
    return scope["features"]


def scalar_features(names: Sequence[str], cutoff_micros: int) -> Features:
    """A function of one customer's aggregates (:data:`tasks.definitions.feature_formulas.AGGREGATES`
    as Python floats) giving its features ``names`` at the cutoff ``cutoff_micros``, in that
    order (compiled once per names and cutoff: a cutoff is a day's end, so once a day)."""
    return _compiled(tuple(names), cutoff_micros)
