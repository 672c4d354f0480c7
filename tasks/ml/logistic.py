"""Logistic regression by Newton's method in plain numpy: the solver behind Platt and temperature
scaling and the baseline model (a handful of columns, any number of rows)."""

from __future__ import annotations

import numpy as np


def sigmoid(z: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-z))`` in float64 without overflow warnings."""
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(-np.abs(z))  # exp(z) where z < 0, exp(-z) elsewhere: never overflows
    denominator = 1.0 + e
    np.divide(e, denominator, out=e)
    out = np.divide(1.0, denominator, out=denominator)
    np.copyto(out, e, where=z < 0)
    return out


def _penalised_loss(x1: np.ndarray, y: np.ndarray, w: np.ndarray, penalty: np.ndarray) -> float:
    z = x1 @ w
    # log(1 + exp(z)) - y z, written stably
    loss = np.mean(np.logaddexp(0.0, z) - y * z)
    return float(loss + 0.5 * np.sum(penalty * w * w))


def fit_logistic(
    x: np.ndarray,
    y: np.ndarray,
    *,
    intercept: bool = True,
    l2: float = 1e-6,
    max_iter: int = 100,
    tol: float = 1e-9,
) -> tuple[np.ndarray, float]:
    """``(coefficients, intercept)`` minimising mean log loss + ``l2/2 * |coef|^2`` (the
    intercept is not penalised; 0.0 without one). Newton steps, halved while the loss rises."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    y = np.asarray(y, dtype=np.float64)
    if len(y) == 0 or len(y) != len(x):
        raise ValueError(f"logistic regression needs matching rows: {len(x)} x, {len(y)} labels")
    x1 = np.column_stack([x, np.ones(len(x))]) if intercept else x
    k = x1.shape[1]
    penalty = np.full(k, l2)
    if intercept:
        penalty[-1] = 0.0
    w = np.zeros(k)
    loss = _penalised_loss(x1, y, w, penalty)
    for _ in range(max_iter):
        p = sigmoid(x1 @ w)
        grad = x1.T @ (p - y) / len(y) + penalty * w
        hess = (x1 * (p * (1 - p))[:, None]).T @ x1 / len(y) + np.diag(penalty + 1e-12)
        step = np.linalg.solve(hess, grad)
        t = 1.0
        while True:
            candidate = w - t * step
            new_loss = _penalised_loss(x1, y, candidate, penalty)
            if new_loss <= loss + 1e-15 or t < 1e-8:
                break
            t /= 2
        w, loss = candidate, new_loss
        if np.max(np.abs(t * step)) < tol:
            break
    if intercept:
        return w[:-1], float(w[-1])
    return w, 0.0
