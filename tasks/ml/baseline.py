"""The baseline every candidate must beat: logistic regression on recency, frequency, monetary
value and tenure (the classic RFM model), in plain numpy.

Each feature goes through the model's own transform (``signed_log1p``, then standardised with the
train rows' mean and std), so the baseline differs from the network only in what it may look at
and how flexible it is. Fitted by Newton's method with a small L2 penalty; deterministic.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

from tasks.ml.logistic import fit_logistic, sigmoid
from tasks.ml.normalizer import signed_log1p

BASELINE_FEATURES: tuple[str, ...] = (
    "purchase_recency_days",  # recency
    "n_purchases",  # frequency
    "purchase_amount_mean",  # monetary
    "tenure_days",  # tenure
)
BASELINE_L2 = 1e-4
BASELINE_NAME = "logistic regression on recency, frequency, monetary value and tenure"
BASELINE_FAMILY = "rfm"
"""The model family whose recipe is this baseline's (:mod:`tasks.ml.models.rfm`): the servable
baseline, which the gate knows cannot beat itself."""


class LogisticBaseline(BaseModel):
    """A fitted baseline: its features, their standardisation and the coefficients."""

    features: list[str]
    mean: list[float]
    std: list[float]
    coefficients: list[float]
    intercept: float

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        """Probabilities for raw feature rows in :attr:`features` order."""
        return sigmoid(self._design(x) @ np.asarray(self.coefficients) + self.intercept)

    def _design(self, x: np.ndarray) -> np.ndarray:
        logged = signed_log1p(x)
        return (logged - np.asarray(self.mean)) / np.asarray(self.std)


def baseline_columns(features: list[str]) -> list[int]:
    """Positions of :data:`BASELINE_FEATURES` in a model's feature list; a clear error naming the
    missing ones (every input has them: they need only the required event columns)."""
    missing = [f for f in BASELINE_FEATURES if f not in features]
    if missing:
        raise ValueError(f"the baseline needs feature(s) {missing}, absent from the snapshot")
    return [features.index(f) for f in BASELINE_FEATURES]


def fit_baseline(x: np.ndarray, y: np.ndarray) -> LogisticBaseline:
    """Fit on raw feature rows ``x`` (columns in :data:`BASELINE_FEATURES` order) and labels."""
    logged = signed_log1p(x)
    mean = logged.mean(axis=0)
    std = logged.std(axis=0)
    std = np.where(std > 1e-9, std, 1.0)
    coefficients, intercept = fit_logistic((logged - mean) / std, y, l2=BASELINE_L2)
    return LogisticBaseline(
        features=list(BASELINE_FEATURES),
        mean=mean.tolist(),
        std=std.tolist(),
        coefficients=coefficients.tolist(),
        intercept=intercept,
    )
