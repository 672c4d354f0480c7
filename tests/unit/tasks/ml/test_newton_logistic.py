"""The logistic family's blocked Newton solver (float32 Hessian, intercept from sums) against
the plain float64 numpy solver on the same rows: the same optimum."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.ml.logistic import fit_logistic
from tasks.ml.models.logistic import newton_logistic


@pytest.mark.parametrize("l2", [1e-2, 1e-4])
def test_blocked_newton_reaches_the_float64_solvers_optimum(l2):
    rng = np.random.default_rng(4)
    n, k = 5000, 12
    z = rng.normal(size=(n, k)).astype(np.float32)
    z[:, 1] = 0.9 * z[:, 0] + 0.1 * z[:, 1]  # correlated columns: the Hessian matters
    logits = z @ rng.normal(0.0, 0.8, k) - 0.7
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    # blocks of 700 rows: several blocks and a short last one
    w, steps = newton_logistic(z, y, l2, block_rows=700, tol=1e-10)
    coef, intercept = fit_logistic(z.astype(np.float64), y, l2=l2, tol=1e-12)
    assert steps < 20
    assert np.allclose(w[:-1], coef, atol=1e-6)
    assert w[-1] == pytest.approx(intercept, abs=1e-6)
    # a warm start at the optimum stops at once
    _, again = newton_logistic(z, y, l2, start=w, block_rows=700, tol=1e-8)
    assert again <= 2
