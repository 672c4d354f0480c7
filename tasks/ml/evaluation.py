"""What a trained version is judged by, as records (no torch here, so CPU stages and the summary
can read them): the candidate, calibrated and raw, against the baseline, on the test split and in
the out-of-time backtest, and the check the promotion gate applies.

The backtest trains the same way one horizon earlier — on origins from T-2H down, every label
window ending by T-H — and scores the customers at T-H, judged on what they really did in
(T-H, T]: exactly the run's training examples at its newest origin, every split. It answers "how well would this pipeline have predicted the last
horizon?", which a random customer split inside the training window cannot.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, Field

from tasks.ml.baseline import BASELINE_NAME
from tasks.ml.calibration import Calibration
from tasks.ml.metrics import QualityMetrics
from tasks.ml.promotion import BaselineCheck


class CalibrationScore(BaseModel):
    """One calibration method, fitted on the held-out rows and judged on the evaluated set."""

    logloss: float
    brier: float
    ece: float
    mean_score: float


class ModelComparison(BaseModel):
    """The candidate (calibrated and raw) and the baseline on the same labelled rows."""

    model: QualityMetrics = Field(description="the candidate's calibrated scores")
    model_uncalibrated: QualityMetrics
    baseline: QualityMetrics = Field(description=BASELINE_NAME)
    calibration_methods: dict[str, CalibrationScore] = Field(
        default_factory=dict, description="every method, fitted on the same held-out rows"
    )


class BacktestWindows(BaseModel):
    """The dates of a backtest for as-of T and horizon H (each window ends at that day's end)."""

    train_features_until: dt.date = Field(description="T-2H")
    train_labels_until: dt.date = Field(description="T-H: labels in (T-2H, T-H]")
    judged_labels_until: dt.date = Field(description="T: outcomes in (T-H, T]")

    @classmethod
    def of(cls, as_of: dt.date, horizon_days: int) -> BacktestWindows:
        """The windows of the run at ``as_of`` with horizon ``horizon_days``."""
        h = dt.timedelta(days=horizon_days)
        return cls(
            train_features_until=as_of - 2 * h,
            train_labels_until=as_of - h,
            judged_labels_until=as_of,
        )


class BacktestReport(BaseModel):
    """The out-of-time backtest of a run, or why it was skipped."""

    status: Literal["done", "skipped"]
    reason: str = ""
    windows: BacktestWindows
    origins: list[dt.date] = Field(
        default_factory=list, description="the training origins, newest (T-2H) first"
    )
    n_train: int = 0
    n_judged: int = 0
    calibration: Calibration | None = None
    result: ModelComparison | None = None


class ModelEvaluation(BaseModel):
    """Everything a version is judged by; stored in its manifest and shown on its card."""

    calibration: Calibration
    test: ModelComparison
    backtest: BacktestReport

    def baseline_check(self, *, own_recipe: bool = False) -> BaselineCheck:
        """Backtest log loss of the calibrated model against the baseline's; the test split's
        when the backtest was skipped (the check says so). ``own_recipe``: the model is the
        baseline's recipe (family ``rfm``), which meets the rule by definition."""
        if self.backtest.result is not None:
            bt = self.backtest.result
            return BaselineCheck(
                basis="backtest",
                model_logloss=bt.model.logloss,
                baseline_logloss=bt.baseline.logloss,
                own_recipe=own_recipe,
            )
        return BaselineCheck(
            basis="test split",
            model_logloss=self.test.model.logloss,
            baseline_logloss=self.test.baseline.logloss,
            note=f"backtest skipped: {self.backtest.reason}",
            own_recipe=own_recipe,
        )

    def flat_metrics(self) -> dict[str, float]:
        """Scalar figures for the manifest's ``metrics`` (``models list``) and the summary."""
        out: dict[str, float] = {}
        for prefix, comparison in (("test", self.test), ("backtest", self.backtest.result)):
            if comparison is None:
                continue
            for name, value in comparison.model.headline().items():
                out[f"{prefix}_{name}"] = value
            raw, base = comparison.model_uncalibrated, comparison.baseline
            out[f"{prefix}_logloss_uncalibrated"] = raw.logloss
            out[f"{prefix}_ece_uncalibrated"] = raw.ece
            out[f"{prefix}_mean_score_uncalibrated"] = raw.mean_score
            out[f"baseline_{prefix}_auc"] = base.auc
            out[f"baseline_{prefix}_logloss"] = base.logloss
            out[f"baseline_{prefix}_ece"] = base.ece
        return out
