"""Population stability: PSI from bin counts, quantile bin edges, a measure's status.

Plain Python (no Spark): the drift runner hands it the counts Spark aggregated. For the shares
``e`` (reference: the training data) and ``a`` (actual: the new data) over the same bins or
categories, the population stability index is ``PSI = sum_i (a_i - e_i) * ln(a_i / e_i)``. A bin
that is empty on one side counts as ``min_share``, so an empty bin or a category the reference
never had gives a large but finite value. Conventional reading: below 0.1 stable, 0.1-0.25 a
moderate shift, above 0.25 a significant one.

A numeric feature is binned by edges ``e_1 < ... < e_m`` (training quantiles): bin ``i`` holds
``e_i < x <= e_(i+1)``, i.e. a value's bin is the number of edges below it (``bin_of``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Literal

import numpy as np

Status = Literal["ok", "drift", "n/a", "ignored"]
NULL_BIN = -1  # the bin of a missing value


def shares(
    counts: Mapping[Hashable, int], keys: Iterable[Hashable], min_share: float
) -> list[float]:
    """Each key's share of ``counts`` (a key without a count: ``min_share``), in ``keys`` order."""
    total = sum(counts.values())
    if total <= 0:
        raise ValueError("an empty distribution has no shares")
    return [max(counts.get(k, 0) / total, min_share) for k in keys]


def psi(
    expected: Mapping[Hashable, int], actual: Mapping[Hashable, int], min_share: float = 1e-4
) -> float:
    """The population stability index of ``actual`` against ``expected`` (counts per bin or
    category; keys on either side only count as ``min_share`` on the other)."""
    keys = sorted(set(expected) | set(actual), key=repr)
    e = shares(expected, keys, min_share)
    a = shares(actual, keys, min_share)
    return sum((ai - ei) * math.log(ai / ei) for ei, ai in zip(e, a, strict=True))


def bin_edges(quantiles: Sequence[float | None]) -> list[float]:
    """Sorted distinct finite edges from quantile values: ties collapse, so a feature that is 0
    for 80% of customers gets one edge at 0 (bins ``<= 0`` and ``> 0``), not eight."""
    finite = {float(q) for q in quantiles if q is not None and math.isfinite(q)}
    return sorted(finite)


def bin_of(value: float | None, edges: Sequence[float]) -> int:
    """The bin of ``value``: how many edges lie below it (``NULL_BIN`` for a missing value)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NULL_BIN
    return bisect.bisect_left(edges, value)


def quantile_probabilities(bins: int) -> list[float]:
    """The probabilities whose quantiles split a distribution into ``bins`` equal parts."""
    if bins < 2:
        raise ValueError(f"need at least 2 bins, not {bins}")
    return [i / bins for i in range(1, bins)]


def exact_quantile_edges(values: np.ndarray, bins: int) -> list[float]:
    """The edges of ``bins`` quantiles of a sample held in memory (a test split's scores), each
    the smallest value with at least that share of the sample at or below it, as Spark's
    ``percentile_approx`` picks them at full accuracy; NaNs are left out."""
    ordered = np.sort(values[np.isfinite(values)])
    if ordered.size == 0:
        return []
    n = ordered.size
    return bin_edges(
        float(ordered[min(n - 1, max(0, math.ceil(p * n) - 1))])
        for p in quantile_probabilities(bins)
    )


def score_band_edges(scores: np.ndarray, bins: int, resolution: float) -> list[float]:
    """A score distribution's bin edges: its ``bins`` quantiles rounded to ``resolution`` (a
    probability step) and merged, edges at 0 or 1 left out. Quantiles of a propensity score crowd
    where most customers score near 0 (0.0034 and 0.0041 became two bins), so PSI on them counts
    shuffles among customers who all score below 1% as a shift; bands a step wide count what moves
    a score from one band to another."""
    rounded = (
        round(round(edge / resolution) * resolution, 12)
        for edge in exact_quantile_edges(scores, bins)
    )
    return sorted({edge for edge in rounded if 0.0 < edge < 1.0})


# Up to this many edges a sample is counted per edge (one comparison pass each: 0.4 ms per
# million values) rather than binned value by value (``searchsorted``: 20 ms per million).
COUNT_BY_EDGE_MAX = 32


def sample_bin_counts(values: np.ndarray, edges: Sequence[float]) -> dict[int, int]:
    """Rows per bin of a sample held in memory, binned as :func:`bin_of` bins one value (bins
    with no row left out; the null bin first, then by bin)."""
    limits = np.asarray(edges, dtype=np.float64)
    missing = int(np.count_nonzero(np.isnan(values)))
    if limits.size <= COUNT_BY_EDGE_MAX:
        # bin i holds e_(i-1) < x <= e_i: the differences of the counts at or below each edge
        at_or_below = [np.count_nonzero(values <= edge) for edge in limits]
        per_bin = np.diff([0, *at_or_below, values.size - missing])
    else:
        present = values[~np.isnan(values)] if missing else values
        per_bin = np.bincount(np.searchsorted(limits, present), minlength=limits.size + 1)
    counts = {NULL_BIN: missing, **dict(enumerate(per_bin.tolist()))}
    return {b: c for b, c in counts.items() if c}


def status(value: float | None, threshold: float) -> Status:
    """``drift`` above the threshold, ``ok`` at or below it, ``n/a`` when not measured."""
    if value is None:
        return "n/a"
    return "drift" if value > threshold else "ok"
