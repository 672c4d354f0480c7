"""Post-hoc calibration: a monotone map from the network's logit to a probability, fitted on
held-out rows so that a score of 0.2 means "about one in five of these customers buys".

Three methods, all fitted by minimising log loss on the held-out logits and labels:

* ``temperature``: ``sigmoid(z / T)`` — one parameter; fixes over/under-confidence, not a
  shifted base rate;
* ``platt``: ``sigmoid(a z + b)`` — also moves the base rate;
* ``isotonic``: the pool-adjacent-violators fit of the observed rate against the logit,
  interpolated linearly between block centres (any monotone shape; needs more rows).

A fitted map is kept only when it pays (:func:`calibration_that_pays`): cross-validated on the
held-out rows, it must lower their log loss by more than its own noise; a few hundred rows
rarely show a real miscalibration, and a temperature fitted to their noise costs more out of
time than it gains. Otherwise the model keeps the identity, with the reason recorded.

A :class:`Calibration` is part of the model bundle (``model.json``), so every path that scores
(batch, real time) applies the same map. ``none`` is the identity (bundles from before it).
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, Field

from infra.settings import CalibrationMethod
from tasks.ml.logistic import fit_logistic, sigmoid

FITTED_METHODS: tuple[CalibrationMethod, ...] = ("temperature", "platt", "isotonic")
CHECK_FOLDS = 5  # folds of the held-out rows a fitted map is cross-validated on
CHECK_SEED = 0  # the rows' assignment to folds: fixed, so a refit decides the same
ISOTONIC_PRIOR_ROWS = 1.0  # pseudo-rows at the overall rate added to every isotonic block


class Calibration(BaseModel):
    """The logit -> probability map of a model; the identity unless fitted."""

    method: CalibrationMethod = "none"
    slope: float = Field(default=1.0, description="temperature: 1/T; platt: a")
    intercept: float = Field(default=0.0, description="platt: b")
    knots_logit: list[float] = Field(default_factory=list, description="isotonic: increasing")
    knots_probability: list[float] = Field(default_factory=list, description="isotonic: monotone")
    fitted_rows: int = Field(default=0, description="held-out rows it was fitted on")
    declined: str = Field(
        default="", description="the identity: why the configured map was not kept"
    )

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """Calibrated probabilities (float64) for raw logits."""
        z = np.asarray(logits, dtype=np.float64)
        if self.method == "isotonic":
            return np.interp(z, self.knots_logit, self.knots_probability)
        return sigmoid(self.slope * z + self.intercept)

    def describe(self) -> str:
        """One line for logs and the model card."""
        if self.method == "none":
            return f"none ({self.declined})" if self.declined else "none (raw sigmoid of the logit)"
        if self.method == "temperature":
            return f"temperature T={1 / self.slope:.4f} on {self.fitted_rows} held-out rows"
        if self.method == "platt":
            return (
                f"Platt sigmoid({self.slope:.4f} z {self.intercept:+.4f}) "
                f"on {self.fitted_rows} held-out rows"
            )
        return f"isotonic, {len(self.knots_logit)} knots, on {self.fitted_rows} held-out rows"


def fit_calibration(
    logits: np.ndarray, labels: np.ndarray, method: CalibrationMethod
) -> Calibration:
    """Fit ``method`` on held-out ``logits`` and 0/1 ``labels`` (both classes needed)."""
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if method == "none":
        return Calibration()
    if len(z) != len(y) or not 0 < y.sum() < len(y):
        raise ValueError(
            f"calibration needs held-out rows with both classes ({len(y)} rows, "
            f"{int(y.sum())} positive)"
        )
    if method == "temperature":
        slope, _ = fit_logistic(z, y, intercept=False, l2=0.0)
        return Calibration(method=method, slope=float(slope[0]), fitted_rows=len(y))
    if method == "platt":
        slope, intercept = fit_logistic(z, y, intercept=True, l2=0.0)
        return Calibration(
            method=method, slope=float(slope[0]), intercept=intercept, fitted_rows=len(y)
        )
    if method == "isotonic":
        knots_z, knots_p = isotonic_knots(z, y)
        return Calibration(
            method=method,
            knots_logit=knots_z.tolist(),
            knots_probability=knots_p.tolist(),
            fitted_rows=len(y),
        )
    raise ValueError(f"unknown calibration method {method!r}")


def calibration_that_pays(
    logits: np.ndarray, labels: np.ndarray, method: CalibrationMethod
) -> Calibration:
    """``method`` fitted on all the held-out rows when, cross-validated on them
    (:data:`CHECK_FOLDS` folds, each row scored by the map fitted without its fold), it lowers
    their log loss against the raw sigmoid by more than one standard error of the paired
    per-row difference; else the identity, saying why."""
    fitted = fit_calibration(logits, labels, method)
    if method == "none":
        return fitted
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    change = np.empty(len(z))
    order = np.random.default_rng(CHECK_SEED).permutation(len(z))
    for fold in np.array_split(order, CHECK_FOLDS):
        outside = np.ones(len(z), dtype=bool)
        outside[fold] = False
        rest = np.flatnonzero(outside)  # the other folds' rows, in row order
        if not 0 < y[rest].sum() < len(rest):  # a fold took every row of a class
            change[fold] = 0.0
            continue
        mapped = fit_calibration(z[rest], y[rest], method).probabilities(z[fold])
        change[fold] = _row_log_loss(y[fold], mapped) - _row_log_loss(y[fold], sigmoid(z[fold]))
    gain = -float(change.mean())
    noise = float(change.std(ddof=1) / np.sqrt(len(change))) if len(change) > 1 else np.inf
    if gain > noise:
        return fitted
    return Calibration(
        fitted_rows=len(y),
        declined=(
            f"{method} did not pay on {len(y)} held-out rows: cross-validated log loss "
            f"{-gain:+.4f} against the raw sigmoid, noise {noise:.4f}"
        ),
    )


def _row_log_loss(y: np.ndarray, p: np.ndarray, eps: float = 1e-7) -> np.ndarray:
    p = np.clip(p, eps, 1 - eps)
    return -(y * np.log(p) + (1 - y) * np.log(1 - p))


def isotonic_knots(z: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pool adjacent violators on the rate against ``z``: the blocks' mean logits (increasing)
    and their rates, each shrunk by :data:`ISOTONIC_PRIOR_ROWS` towards the overall rate so that
    no block says exactly 0 or 1."""
    values, inverse = np.unique(z, return_inverse=True)
    weight = np.bincount(inverse).astype(np.float64)
    positives = np.bincount(inverse, weights=y)
    z_sum = values * weight
    # the blocks as three stacks of Python floats (numpy scalars made the loop 3x slower: 0.4
    # s a fit at 235k held-out rows); each new value is merged into the blocks before it
    # while their rate is not below its own, every sum the same float addition as before
    rows: list[float] = []
    hits: list[float] = []
    sums: list[float] = []
    for w, pos, zs in zip(weight.tolist(), positives.tolist(), z_sum.tolist(), strict=True):
        while rows and hits[-1] * w >= pos * rows[-1]:
            w += rows.pop()
            pos += hits.pop()
            zs += sums.pop()
        rows.append(w)
        hits.append(pos)
        sums.append(zs)
    block_rows, block_hits = np.asarray(rows), np.asarray(hits)
    rate = y.mean()
    knots_p = (block_hits + ISOTONIC_PRIOR_ROWS * rate) / (block_rows + ISOTONIC_PRIOR_ROWS)
    return np.asarray(sums) / block_rows, np.maximum.accumulate(knots_p)
