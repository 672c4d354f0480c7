"""The RFM logistic-regression baseline and the Newton solver under it."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.ml.baseline import BASELINE_FEATURES, baseline_columns, fit_baseline
from tasks.ml.logistic import fit_logistic, sigmoid


def test_newton_solver_recovers_known_coefficients():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60_000, 3))
    w, b = np.array([1.5, -0.7, 0.0]), -0.4
    y = (rng.uniform(size=len(x)) < sigmoid(x @ w + b)).astype(float)
    coef, intercept = fit_logistic(x, y, l2=0.0)
    np.testing.assert_allclose(coef, w, atol=0.04)
    assert intercept == pytest.approx(b, abs=0.04)


def test_solver_stays_finite_on_separable_data():
    x = np.array([[-2.0], [-1.0], [1.0], [2.0]])
    coef, intercept = fit_logistic(x, np.array([0, 0, 1, 1]), l2=1e-3)
    assert np.isfinite(coef).all() and np.isfinite(intercept) and coef[0] > 0


def test_baseline_learns_recency_and_frequency():
    rng = np.random.default_rng(1)
    n = 20_000
    recency = rng.exponential(60, n)
    purchases = rng.poisson(4, n).astype(float)
    x = np.column_stack([recency, purchases, rng.lognormal(3, 0.5, n), rng.uniform(30, 700, n)])
    y = (rng.uniform(size=n) < sigmoid(1.0 - 0.03 * recency + 0.3 * purchases)).astype(float)
    baseline = fit_baseline(x, y)
    p = baseline.predict_proba(x)
    assert baseline.coefficients[0] < 0 < baseline.coefficients[1]
    assert (
        abs(p.mean() - y.mean()) < 0.005
    )  # a logistic fit with an intercept is calibrated in-sample
    again = type(baseline).model_validate_json(baseline.model_dump_json())
    np.testing.assert_array_equal(again.predict_proba(x), p)


def test_baseline_columns_name_what_is_missing():
    features = ["a", *BASELINE_FEATURES[::-1]]
    assert [features[i] for i in baseline_columns(features)] == list(BASELINE_FEATURES)
    with pytest.raises(ValueError, match="n_purchases"):
        baseline_columns(["purchase_recency_days", "tenure_days"])
