"""The features of customers in the online state, by the batch stage's formulas
(:func:`tasks.definitions.feature_formulas.feature_values`) evaluated on numpy arrays for many
customers, compiled to a Python function of one customer's record for one (a request's:
:mod:`serving.online.one_row`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from serving.online.one_row import row_features
from serving.online.state import OnlineState, end_of_day_micros
from tasks.definitions.feature_formulas import feature_values


class ArrayOps:
    """The formulas' operations (:class:`tasks.definitions.feature_formulas.Ops`) on arrays of
    doubles, one element per customer, NaN standing for SQL's null (every comparison with it is
    false, as SQL's with null is not true)."""

    def __init__(self, aggregates: dict[str, np.ndarray]) -> None:
        self._aggregates = aggregates

    def agg(self, name: str) -> np.ndarray:
        return self._aggregates[name]

    def lit(self, value: float) -> np.float64:
        return np.float64(value)

    def coalesce(self, value: np.ndarray, default: np.ndarray) -> np.ndarray:
        return np.where(np.isnan(value), default, value)

    def double(self, value: np.ndarray) -> np.ndarray:
        return np.asarray(value, dtype=np.float64)

    def greatest(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        return np.fmax(first, second)  # SQL's greatest skips nulls

    def log(self, value: np.ndarray) -> np.ndarray:
        return np.log(value)

    def if_positive(self, test: np.ndarray, then: np.ndarray, otherwise: np.ndarray) -> np.ndarray:
        return np.where(test > 0, then, otherwise)


def online_features(
    state: OnlineState, rows: np.ndarray, cutoff_day: int, names: Sequence[str]
) -> np.ndarray:
    """Features ``names`` (doubles, rows x names) of the customers at ``rows`` at the end of
    ``cutoff_day``: what the batch features stage computes at that cutoff over the same events
    (ValueError for a day before the newest event's)."""
    return _evaluate(state.aggregates(rows, cutoff_day), cutoff_day, names)


def fresh_features(
    state: OnlineState, rows: np.ndarray, at_least_day: int, names: Sequence[str]
) -> tuple[np.ndarray, int]:
    """:func:`online_features` at the end of ``at_least_day`` or of the newest event's day,
    whichever is later, with the newest event's time (microseconds) they include."""
    if len(rows) == 1:
        values, newest = fresh_features_of_one(state, int(rows[0]), at_least_day, names)
        return np.asarray([values], dtype=np.float64), newest
    reading = state.read(rows, at_least_day)
    return _evaluate(reading.aggregates, reading.day, names), reading.newest


def fresh_features_of_one(
    state: OnlineState, row: int, at_least_day: int, names: Sequence[str]
) -> tuple[tuple[float, ...], int]:
    """:func:`fresh_features` of one customer (a request's), as a tuple of floats."""
    one = state.read_row(row, at_least_day)
    values = row_features(names, end_of_day_micros(one.day))(one.record, one.sums, one.mix)
    return values, one.newest


def _evaluate(aggregates: dict[str, np.ndarray], day: int, names: Sequence[str]) -> np.ndarray:
    ops = ArrayOps(aggregates)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = feature_values(ops, end_of_day_micros(day))
        out = np.empty((len(next(iter(aggregates.values()))), len(names)), dtype=np.float64)
        for j, name in enumerate(names):
            out[:, j] = values[name]
    return out
