"""The ``logistic`` family: L2-regularised logistic regression on every feature of the snapshot.

Each feature goes through the snapshot's normaliser (``signed_log1p``, standardised on the
train split), as for the network; the coefficients are fitted by Newton's method on all train
rows, streamed in blocks (memory: the float32 train matrix), for each penalty of
:attr:`LogisticSpec.l2_grid` from the strongest down, each fit starting from the previous one;
the penalty with the lowest validation log loss wins. It is the RFM baseline of
:mod:`tasks.ml.baseline` grown up: the same model form and transform on the full feature set,
servable and regularised — the baseline stays the gate's floor.

Bundle: ``model.json`` only (coefficients, normaliser, calibration). Warm start: Newton starts
from production's coefficients (same features), which converges in fewer steps.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from infra.settings import TrainingSettings
from tasks.ml.calibration import Calibration
from tasks.ml.logistic import sigmoid
from tasks.ml.metrics import log_loss
from tasks.ml.models.base import (
    ConfiguredModel,
    CostHints,
    FamilySpec,
    FitJob,
    FitOutcome,
    FittedModel,
    ModelFamily,
    fit_threads,
    split_arrays,
    torch_threads,
)
from tasks.ml.models.registry import register_family
from tasks.ml.normalizer import Normalizer

if TYPE_CHECKING:  # imported where a fit needs it: planning reads the cost hints only
    import torch

BLOCK_ROWS = 65_536
NEWTON_PASSES_PER_ITERATION = 2  # gradient + Hessian, then the line search's loss
NEWTON_ITERATIONS_HINT = 8  # the router's estimate of Newton steps per penalty


class LogisticSpec(FamilySpec):
    """The penalties tried (mean log loss + ``l2/2 * |w|^2`` on standardised features)."""

    kind: Literal["logistic"] = "logistic"
    l2_grid: list[float] = Field(default=[1e-2, 1e-3, 1e-4], min_length=1)
    max_iter: int = Field(default=50, ge=1)
    tol: float = Field(default=1e-7, gt=0)


class LogisticConfig(BaseModel):
    """A fitted logistic regression: all it needs to score, as JSON."""

    kind: Literal["logistic"] = "logistic"
    features: list[str]
    norm_mean: list[float]
    norm_std: list[float]
    coefficients: list[float]
    intercept: float
    l2: float
    calibration: Calibration = Field(default_factory=Calibration)


class LogisticModel(ConfiguredModel):
    """Logits = standardised ``signed_log1p`` features times the coefficients plus intercept."""

    kind = "logistic"

    def __init__(self, config: LogisticConfig) -> None:
        self.config = config
        self._normalizer = Normalizer(
            features=config.features, mean=config.norm_mean, std=config.norm_std
        )
        self._w = np.asarray(config.coefficients, dtype=np.float64)

    def logits(self, x: np.ndarray) -> np.ndarray:
        return self._normalizer.transform(x) @ self._w + self.config.intercept

    def bundle_files(self) -> dict[str, bytes]:
        return self.config_file()

    @property
    def n_parameters(self) -> int:
        return len(self._w) + 1

    def describe(self) -> str:
        return f"logistic on {len(self._w)} features, L2 {self.config.l2:g}"


class LogisticFamily(ModelFamily):
    """Regularised logistic regression fitted by Newton's method on every train row."""

    kind = "logistic"
    spec_type = LogisticSpec

    def fit(self, spec: FamilySpec, job: FitJob) -> FitOutcome:
        assert isinstance(spec, LogisticSpec)
        started = time.perf_counter()
        norm = job.normalizer
        x, y = split_arrays(job.data, "train")
        vx, vy = split_arrays(job.data, "val")
        z, vz = _standardised(x, norm), _standardised(vx, norm)
        threads = fit_threads(len(y), job.settings.threads)
        w = None
        if isinstance(job.start, LogisticModel):
            w = np.append(job.start.config.coefficients, job.start.config.intercept)
        best: tuple[float, float, np.ndarray] | None = None
        iterations = 0
        with torch_threads(threads):
            for l2 in sorted(spec.l2_grid, reverse=True):
                w, steps = newton_logistic(z, y, l2, w, max_iter=spec.max_iter, tol=spec.tol)
                iterations += steps
                val = log_loss(vy, sigmoid(vz @ w[:-1] + w[-1])) if len(vy) else 0.0
                if best is None or val < best[0]:
                    best = (val, l2, w.copy())
        assert best is not None
        val_logloss, l2, w = best
        model = LogisticModel(
            LogisticConfig(
                features=norm.features,
                norm_mean=norm.mean,
                norm_std=norm.std,
                coefficients=w[:-1].tolist(),
                intercept=float(w[-1]),
                l2=l2,
            )
        )
        return FitOutcome(
            model=model,
            seconds=time.perf_counter() - started,
            record={
                "device": "cpu",
                "threads": threads,
                "l2": l2,
                "newton_iterations": iterations,
                "val_logloss_raw": val_logloss,
                "rows": len(y),
            },
        )

    def load(self, config: dict[str, Any], files: dict[str, bytes]) -> LogisticModel:
        return LogisticModel(LogisticConfig.model_validate(config))

    def cost_hints(
        self,
        spec: FamilySpec,
        n_features: int,
        settings: TrainingSettings,
        sequence_length: int = 0,
    ) -> CostHints:
        assert isinstance(spec, LogisticSpec)
        k = n_features + 1
        per_pass = 2.0 * k * k  # the Hessian's outer products dominate
        return CostHints(
            parameters=k,
            train_flops_per_row=per_pass
            * NEWTON_PASSES_PER_ITERATION
            * NEWTON_ITERATIONS_HINT
            * len(spec.l2_grid),
            score_flops_per_row=2.0 * k,
            network=False,
        )

    def warm_start(self, production: FittedModel, spec: FamilySpec) -> FittedModel | str:
        return production


def _standardised(x: np.ndarray, normalizer: Normalizer) -> np.ndarray:
    """The normalised features as float32, transformed a block at a time."""
    out = np.empty(x.shape, dtype=np.float32)
    for lo in range(0, len(x), BLOCK_ROWS):
        out[lo : lo + BLOCK_ROWS] = normalizer.transform(x[lo : lo + BLOCK_ROWS])
    return out


def newton_logistic(
    z: np.ndarray,
    y: np.ndarray,
    l2: float,
    start: np.ndarray | None = None,
    *,
    max_iter: int = 50,
    tol: float = 1e-7,
    block_rows: int = BLOCK_ROWS,
) -> tuple[np.ndarray, int]:
    """``(weights with the intercept last, Newton steps)`` minimising mean log loss +
    ``l2/2 * |coef|^2`` (intercept unpenalised) over the rows of ``z``, in blocks of
    ``block_rows``, in torch (whose thread count the caller sets: numpy's BLAS threads cannot
    be told to stay out of a busy machine's way). Logits, gradient and loss are float64 sums;
    the Hessian, which only steers the step (the line search and the gradient decide where it
    ends), is a float32 product per block summed in float64. The intercept's row and column
    come from sums, not from a column of ones appended to every block (that copy was 30% of a
    fit). Steps are halved while the loss rises."""
    import torch

    n, k = z.shape
    if n == 0:
        raise ValueError("logistic regression needs at least one row")
    zt = torch.from_numpy(np.ascontiguousarray(z, dtype=np.float32))
    yt = torch.from_numpy(np.asarray(y, dtype=np.float64))
    penalty = torch.full((k + 1,), float(l2), dtype=torch.float64)
    penalty[-1] = 0.0
    w = torch.zeros(k + 1, dtype=torch.float64) if start is None else torch.tensor(start).double()
    loss = _loss(zt, yt, w, penalty, block_rows)
    steps = 0
    for steps in range(1, max_iter + 1):  # noqa: B007 - the count is returned
        grad = torch.zeros(k + 1, dtype=torch.float64)
        hess = torch.zeros((k + 1, k + 1), dtype=torch.float64)
        for lo in range(0, n, block_rows):
            block = zt[lo : lo + block_rows]
            wide = block.double()
            p = torch.sigmoid(wide @ w[:-1] + w[-1])
            r = p - yt[lo : lo + block_rows]
            grad[:-1] += wide.T @ r
            grad[-1] += r.sum()
            d = p * (1.0 - p)
            weighted = block * d.float()[:, None]
            hess[:-1, :-1] += (weighted.T @ block).double()
            column = weighted.sum(dim=0, dtype=torch.float64)
            hess[:-1, -1] += column
            hess[-1, :-1] += column
            hess[-1, -1] += d.sum()
        grad = grad / n + penalty * w
        hess = hess / n + torch.diag(penalty + 1e-10)
        step = torch.linalg.solve(hess, grad)
        t = 1.0
        while True:
            candidate = w - t * step
            new_loss = _loss(zt, yt, candidate, penalty, block_rows)
            if new_loss <= loss + 1e-15 or t < 1e-8:
                break
            t /= 2
        w, loss = candidate, new_loss
        if float(torch.max(torch.abs(t * step))) < tol:
            break
    return w.numpy(), steps


def _loss(
    z: torch.Tensor, y: torch.Tensor, w: torch.Tensor, penalty: torch.Tensor, block: int
) -> float:
    import torch

    total = 0.0
    for lo in range(0, len(y), block):
        s = z[lo : lo + block].double() @ w[:-1] + w[-1]
        total += float(torch.sum(torch.logaddexp(torch.zeros_like(s), s) - y[lo : lo + block] * s))
    return total / len(y) + 0.5 * float(torch.sum(penalty * w * w))


register_family(LogisticFamily())
