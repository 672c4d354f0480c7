"""Binary classification metrics in plain numpy: ranking (ROC AUC, PR AUC, lift) and whether the
probabilities mean what they say (log loss, Brier score, reliability table, calibration error)."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, Field


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties). A tie group's
    rank and positives do not depend on its rows' order, so any sort gives the same value: the
    default one, 4.5x faster than the stable sort of :func:`descending` on 300k scores (every
    epoch of a network fit computes it on the val split)."""
    y = np.asarray(labels, dtype=float)
    s = np.asarray(scores, dtype=float)
    order = np.argsort(-s)
    return _roc_auc_sorted(y[order], s[order])


def pr_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Average precision: the step-wise area under the precision-recall curve."""
    y = np.asarray(labels, dtype=float)
    s = np.asarray(scores, dtype=float)
    order = descending(s)
    return _pr_auc_sorted(y[order], s[order])


def descending(scores: np.ndarray) -> np.ndarray:
    """The order of ``scores`` from the highest, ties in input order: the one sort that ROC AUC,
    PR AUC and the lift table share (sorting 1.5M scores three times was most of a model's
    judging time at 30M events)."""
    return np.argsort(-np.asarray(scores, dtype=float), kind="stable")


def _roc_auc_sorted(y: np.ndarray, s: np.ndarray) -> float:
    """ROC AUC of labels ``y`` and scores ``s`` sorted by descending score: each tie group of
    scores gets the average of its ascending ranks."""
    positive = y.astype(bool)
    n_pos = int(positive.sum())
    n_neg = len(y) - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("ROC AUC needs both classes")
    n = len(s)
    boundaries = np.flatnonzero(np.diff(s)) + 1
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [n]))
    # descending positions [start, end) hold ascending ranks n - end + 1 .. n - start
    avg = (2 * n - starts - ends + 1) / 2.0
    positives_in_group = np.add.reduceat(positive.astype(np.int64), starts)
    rank_sum = float(np.sum(avg * positives_in_group))
    return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def _pr_auc_sorted(y: np.ndarray, s: np.ndarray) -> float:
    """Average precision of labels ``y`` and scores ``s`` sorted by descending score."""
    n_pos = y.sum()
    if n_pos == 0:
        raise ValueError("PR AUC needs at least one positive")
    last_of_tie = np.r_[np.flatnonzero(np.diff(s)), len(s) - 1]
    tp = np.cumsum(y)[last_of_tie]
    fp = (last_of_tie + 1) - tp
    precision = tp / (tp + fp)
    recall = tp / n_pos
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def log_loss(labels: np.ndarray, probabilities: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy of probabilities against 0/1 labels."""
    y = np.asarray(labels, dtype=float)
    p = np.clip(np.asarray(probabilities, dtype=float), eps, 1 - eps)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def classification_metrics(labels: np.ndarray, probabilities: np.ndarray) -> dict[str, float]:
    """``auc``, ``pr_auc``, ``logloss`` and the positive rate."""
    return {
        "auc": roc_auc(labels, probabilities),
        "pr_auc": pr_auc(labels, probabilities),
        "logloss": log_loss(labels, probabilities),
        "positive_rate": float(np.mean(labels)),
    }


RELIABILITY_BINS = 10
LIFT_GROUPS = 10


class ReliabilityBin(BaseModel):
    """One bin of a reliability table: scores in ``[lower, upper)`` (the last bin includes 1)."""

    lower: float
    upper: float
    n: int
    mean_score: float | None = Field(description="None for an empty bin")
    observed_rate: float | None = Field(description="share of positives; None for an empty bin")


class LiftGroup(BaseModel):
    """One score decile, highest scores first: its positive rate and lift over the base rate."""

    decile: int
    n: int
    mean_score: float
    observed_rate: float
    lift: float
    cumulative_gain: float = Field(description="share of all positives in deciles 1..decile")


class QualityMetrics(BaseModel):
    """How well probabilities rank and how well they mean what they say, on one labelled set."""

    n: int
    positive_rate: float
    mean_score: float
    auc: float
    pr_auc: float
    logloss: float
    brier: float
    ece: float = Field(description="expected calibration error over the reliability bins")
    top_decile_lift: float
    reliability: list[ReliabilityBin]
    lift: list[LiftGroup]

    def headline(self) -> dict[str, float]:
        """The scalar figures (no tables)."""
        return self.model_dump(exclude={"reliability", "lift", "n"})


class ProbabilityMetrics(BaseModel):
    """The figures of probabilities that need no ranking (:func:`probability_metrics`)."""

    logloss: float
    brier: float
    ece: float
    mean_score: float


def brier_score(labels: np.ndarray, probabilities: np.ndarray) -> float:
    """Mean squared difference between probabilities and 0/1 outcomes."""
    y = np.asarray(labels, dtype=float)
    return float(np.mean((np.asarray(probabilities, dtype=float) - y) ** 2))


def reliability_table(
    labels: np.ndarray, probabilities: np.ndarray, bins: int = RELIABILITY_BINS
) -> list[ReliabilityBin]:
    """Mean score against observed rate in ``bins`` equal-width score bins over [0, 1]."""
    y = np.asarray(labels, dtype=float)
    p = np.clip(np.asarray(probabilities, dtype=float), 0.0, 1.0)
    index = np.minimum((p * bins).astype(int), bins - 1)
    n = np.bincount(index, minlength=bins)
    score_sum = np.bincount(index, weights=p, minlength=bins)
    positive_sum = np.bincount(index, weights=y, minlength=bins)
    table = []
    for b in range(bins):
        filled = n[b] > 0
        table.append(
            ReliabilityBin(
                lower=b / bins,
                upper=(b + 1) / bins,
                n=int(n[b]),
                mean_score=float(score_sum[b] / n[b]) if filled else None,
                observed_rate=float(positive_sum[b] / n[b]) if filled else None,
            )
        )
    return table


def expected_calibration_error(table: list[ReliabilityBin]) -> float:
    """Share-weighted mean of ``|mean score - observed rate|`` over a reliability table."""
    total = sum(b.n for b in table)
    if total == 0:
        raise ValueError("expected calibration error of an empty set")
    gaps = [
        b.n * abs(b.mean_score - b.observed_rate)
        for b in table
        if b.mean_score is not None and b.observed_rate is not None
    ]
    return float(sum(gaps) / total)


def lift_table(
    labels: np.ndarray, probabilities: np.ndarray, groups: int = LIFT_GROUPS
) -> list[LiftGroup]:
    """Customers sorted by score (highest first, ties in input order) and cut into ``groups``
    near-equal groups: each group's positive rate, lift over the overall rate, cumulative gain."""
    y = np.asarray(labels, dtype=float)
    p = np.asarray(probabilities, dtype=float)
    order = descending(p)
    return _lift_sorted(y[order], p[order], groups)


def _lift_sorted(y: np.ndarray, p: np.ndarray, groups: int = LIFT_GROUPS) -> list[LiftGroup]:
    """:func:`lift_table` of labels and scores sorted by descending score."""
    if y.sum() == 0:
        raise ValueError("lift needs at least one positive")
    base_rate, positives = float(y.mean()), float(y.sum())
    out, gained = [], 0.0
    size, extra = divmod(len(y), groups)  # np.array_split's cut: the first `extra` get one more
    hi = 0
    for decile in range(1, groups + 1):
        lo, hi = hi, hi + size + (decile <= extra)
        if hi == lo:
            continue
        rate = float(y[lo:hi].mean())
        gained += float(y[lo:hi].sum())
        out.append(
            LiftGroup(
                decile=decile,
                n=hi - lo,
                mean_score=float(p[lo:hi].mean()),
                observed_rate=rate,
                lift=rate / base_rate,
                cumulative_gain=gained / positives,
            )
        )
    return out


def quality_metrics(labels: np.ndarray, probabilities: np.ndarray) -> QualityMetrics:
    """Every figure of :class:`QualityMetrics` for ``probabilities`` against 0/1 ``labels``
    (the ranking figures from one sort)."""
    y = np.asarray(labels, dtype=float)
    p = np.asarray(probabilities, dtype=float)
    reliability = reliability_table(y, p)
    order = descending(p)
    ys, ps = y[order], p[order]
    lift = _lift_sorted(ys, ps)
    return QualityMetrics(
        n=len(y),
        positive_rate=float(y.mean()),
        mean_score=float(p.mean()),
        auc=_roc_auc_sorted(ys, ps),
        pr_auc=_pr_auc_sorted(ys, ps),
        logloss=log_loss(y, p),
        brier=brier_score(y, p),
        ece=expected_calibration_error(reliability),
        top_decile_lift=lift[0].lift,
        reliability=reliability,
        lift=lift,
    )


def probability_metrics(labels: np.ndarray, probabilities: np.ndarray) -> ProbabilityMetrics:
    """The figures of ``probabilities`` that need no ranking: log loss, Brier score, calibration
    error and mean score (what comparing calibration maps needs, without sorting)."""
    y = np.asarray(labels, dtype=float)
    p = np.asarray(probabilities, dtype=float)
    return ProbabilityMetrics(
        logloss=log_loss(y, p),
        brier=brier_score(y, p),
        ece=expected_calibration_error(reliability_table(y, p)),
        mean_score=float(p.mean()),
    )
