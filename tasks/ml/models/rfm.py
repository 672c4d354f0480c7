"""The ``rfm`` family: the RFM baseline's recipe as a servable model.

Logistic regression on exactly :data:`~tasks.ml.baseline.BASELINE_FEATURES` (recency, frequency,
monetary value, tenure) with the baseline's transform (``signed_log1p``, standardised on the
train split: the snapshot's normaliser for those columns) and its penalty
(:data:`~tasks.ml.baseline.BASELINE_L2`, no grid), fitted by the logistic family's Newton code
on every train row and calibrated like every family. On a log whose other features carry no
signal beyond RFM it is the best model a run can serve, and the gate knows its recipe is the
baseline's (:mod:`tasks.ml.promotion`), so a first run always has a model to score with.

It reads the snapshot's features like every family (the endpoint's and the gate's contract: a
request carries the same features whichever family production is) and uses four of them.
Bundle: ``model.json`` only. Fitted fresh each run (four coefficients: nothing to warm-start).
"""

from __future__ import annotations

import time
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from infra.settings import TrainingSettings
from tasks.ml.baseline import BASELINE_FAMILY, BASELINE_FEATURES, BASELINE_L2, baseline_columns
from tasks.ml.calibration import Calibration
from tasks.ml.models.base import (
    ConfiguredModel,
    CostHints,
    FamilySpec,
    FitJob,
    FitOutcome,
    ModelFamily,
    fit_threads,
    split_arrays,
    torch_threads,
)
from tasks.ml.models.logistic import (
    NEWTON_ITERATIONS_HINT,
    NEWTON_PASSES_PER_ITERATION,
    newton_logistic,
)
from tasks.ml.models.registry import register_family
from tasks.ml.normalizer import Normalizer


class RfmSpec(FamilySpec):
    """Nothing to tune: the recipe is the baseline's (features, transform, penalty)."""

    kind: Literal["rfm"] = "rfm"


class RfmConfig(BaseModel):
    """A fitted RFM model: the features it reads, the four it uses, their standardisation, the
    coefficients and the calibration, as JSON."""

    kind: Literal["rfm"] = "rfm"
    features: list[str]
    used: list[str] = Field(default_factory=lambda: list(BASELINE_FEATURES))
    norm_mean: list[float]
    norm_std: list[float]
    coefficients: list[float]
    intercept: float
    l2: float = BASELINE_L2
    calibration: Calibration = Field(default_factory=Calibration)


class RfmModel(ConfiguredModel):
    """Logits = the standardised ``signed_log1p`` RFM columns times the coefficients plus the
    intercept."""

    kind = BASELINE_FAMILY

    def __init__(self, config: RfmConfig) -> None:
        self.config = config
        self._columns = [config.features.index(f) for f in config.used]
        self._normalizer = Normalizer(
            features=config.used, mean=config.norm_mean, std=config.norm_std
        )
        self._w = np.asarray(config.coefficients, dtype=np.float64)

    def logits(self, x: np.ndarray) -> np.ndarray:
        return self._normalizer.transform(np.asarray(x)[:, self._columns]) @ self._w + (
            self.config.intercept
        )

    def bundle_files(self) -> dict[str, bytes]:
        return self.config_file()

    @property
    def n_parameters(self) -> int:
        return len(self._w) + 1

    def describe(self) -> str:
        return (
            f"the RFM baseline's recipe: logistic on {', '.join(self.config.used)}, "
            f"L2 {self.config.l2:g}"
        )


class RfmFamily(ModelFamily):
    """The baseline's logistic regression, fitted by Newton's method on every train row."""

    kind = BASELINE_FAMILY
    spec_type = RfmSpec

    def fit(self, spec: FamilySpec, job: FitJob) -> FitOutcome:
        assert isinstance(spec, RfmSpec)
        started = time.perf_counter()
        norm = job.normalizer
        columns = baseline_columns(norm.features)
        rfm_norm = Normalizer(
            features=list(BASELINE_FEATURES),
            mean=[norm.mean[i] for i in columns],
            std=[norm.std[i] for i in columns],
        )
        x, y = split_arrays(job.data.with_features(list(BASELINE_FEATURES)), "train")
        z = rfm_norm.transform(x).astype(np.float32)
        threads = fit_threads(len(y), job.settings.threads)
        with torch_threads(threads):
            w, steps = newton_logistic(z, y, BASELINE_L2)
        model = RfmModel(
            RfmConfig(
                features=norm.features,
                norm_mean=rfm_norm.mean,
                norm_std=rfm_norm.std,
                coefficients=w[:-1].tolist(),
                intercept=float(w[-1]),
            )
        )
        return FitOutcome(
            model=model,
            seconds=time.perf_counter() - started,
            record={
                "device": "cpu",
                "threads": threads,
                "l2": BASELINE_L2,
                "newton_iterations": steps,
                "rows": len(y),
            },
        )

    def load(self, config: dict[str, Any], files: dict[str, bytes]) -> RfmModel:
        return RfmModel(RfmConfig.model_validate(config))

    def cost_hints(
        self,
        spec: FamilySpec,
        n_features: int,
        settings: TrainingSettings,
        sequence_length: int = 0,
    ) -> CostHints:
        k = len(BASELINE_FEATURES) + 1
        per_pass = 2.0 * k * k  # the Hessian's outer products dominate
        return CostHints(
            parameters=k,
            train_flops_per_row=per_pass * NEWTON_PASSES_PER_ITERATION * NEWTON_ITERATIONS_HINT,
            score_flops_per_row=2.0 * k,
            network=False,
        )


register_family(RfmFamily())
