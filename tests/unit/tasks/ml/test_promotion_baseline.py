"""The gate's baseline rule: a candidate that does not beat the RFM baseline on (backtest) log
loss stays out, whatever production says; the reason says why and how to force it."""

from __future__ import annotations

import datetime as dt

import numpy as np

from tasks.ml.calibration import Calibration
from tasks.ml.evaluation import BacktestReport, BacktestWindows, ModelComparison, ModelEvaluation
from tasks.ml.metrics import quality_metrics
from tasks.ml.promotion import BaselineCheck, GateFigures, decide_promotion


def _fig(logloss: float, auc: float) -> GateFigures:
    return GateFigures(logloss=logloss, auc=auc)


WINDOWS = BacktestWindows.of(dt.date(2025, 12, 31), 90)


def _comparison(model_noise: float, baseline_noise: float, seed: int) -> ModelComparison:
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.02, 0.98, 4000)
    y = (rng.uniform(size=p.size) < p).astype(float)

    def noisy(s):
        return np.clip(p + rng.normal(0, s, p.size), 0.01, 0.99)

    model = quality_metrics(y, noisy(model_noise))
    return ModelComparison(
        model=model,
        model_uncalibrated=quality_metrics(y, noisy(model_noise) ** 1.5),
        baseline=quality_metrics(y, noisy(baseline_noise)),
    )


def test_a_candidate_worse_than_the_baseline_is_kept_out_even_as_first_model():
    check = BaselineCheck(basis="backtest", model_logloss=0.3312, baseline_logloss=0.3290)
    decision = decide_promotion(_fig(0.3312, 0.80), None, 0.0, baseline=check)
    assert not decision.promote and decision.baseline == check
    assert "backtest log loss 0.3312 does not beat the RFM baseline's 0.3290" in decision.reason
    assert "promote=always" in decision.reason
    # also when it would beat production by a wide margin
    assert not decide_promotion(
        _fig(0.3312, 0.90), _fig(0.40, 0.70), 0.01, production_version="m-1", baseline=check
    ).promote


def test_a_candidate_that_beats_the_baseline_still_faces_production():
    check = BaselineCheck(basis="backtest", model_logloss=0.30, baseline_logloss=0.33)
    first = decide_promotion(_fig(0.30, 0.80), None, 0.0, baseline=check)
    assert (
        first.promote and "first model" in first.reason and "beats the RFM baseline" in first.reason
    )
    weaker = decide_promotion(
        _fig(0.30, 0.80), _fig(0.29, 0.79), 0.0, production_version="m-1", baseline=check
    )
    assert not weaker.promote and "does not beat production m-1" in weaker.reason


def test_the_check_uses_the_backtest_and_falls_back_to_the_test_split_when_skipped():
    test = _comparison(0.05, 0.25, seed=1)
    backtest = _comparison(0.25, 0.05, seed=2)  # out of time the baseline wins
    done = ModelEvaluation(
        calibration=Calibration(),
        test=test,
        backtest=BacktestReport(status="done", windows=WINDOWS, result=backtest),
    )
    check = done.baseline_check()
    assert check.basis == "backtest" and not check.beaten
    assert check.model_logloss == backtest.model.logloss
    skipped = ModelEvaluation(
        calibration=Calibration(),
        test=test,
        backtest=BacktestReport(status="skipped", reason="history too short", windows=WINDOWS),
    )
    fallback = skipped.baseline_check()
    assert fallback.basis == "test split" and fallback.beaten
    assert "backtest skipped: history too short" in fallback.describe()


def test_flat_metrics_hold_test_backtest_and_baseline_figures():
    evaluation = ModelEvaluation(
        calibration=Calibration(),
        test=_comparison(0.05, 0.2, seed=3),
        backtest=BacktestReport(status="done", windows=WINDOWS, result=_comparison(0.1, 0.2, 4)),
    )
    flat = evaluation.flat_metrics()
    for key in (
        "test_auc",
        "test_logloss",
        "test_ece",
        "test_brier",
        "test_top_decile_lift",
        "test_logloss_uncalibrated",
        "backtest_auc",
        "backtest_pr_auc",
        "backtest_ece",
        "baseline_backtest_logloss",
        "baseline_test_auc",
    ):
        assert isinstance(flat[key], float), key
    assert WINDOWS.train_features_until == dt.date(2025, 7, 4)
    assert WINDOWS.train_labels_until == dt.date(2025, 10, 2)


def test_the_baseline_recipe_meets_the_baseline_rule_by_definition():
    """A champion of family rfm is the baseline's recipe: promoted as the first model even when
    its calibrated figure is a hair above the raw baseline's, and the reason says why in words."""
    check = BaselineCheck(
        basis="backtest", model_logloss=0.4853, baseline_logloss=0.4850, own_recipe=True
    )
    assert check.passed and not check.beaten
    first = decide_promotion(_fig(0.4853, 0.50), None, 0.0, baseline=check)
    assert first.promote and "first model" in first.reason
    assert "the candidate is the RFM baseline's own recipe (family rfm)" in first.reason
    assert "baseline rule does not apply" in first.reason and "beats" not in first.reason
    # every other rule still holds: it does not replace a production model it does not beat
    kept = decide_promotion(
        _fig(0.4853, 0.50), _fig(0.4700, 0.60), 0.0, production_version="m-1", baseline=check
    )
    assert not kept.promote and "does not beat production m-1" in kept.reason
    # the same figures from another family are refused
    other = check.model_copy(update={"own_recipe": False})
    refused = decide_promotion(_fig(0.4853, 0.50), None, 0.0, baseline=other)
    assert not refused.promote and "does not beat the RFM baseline's 0.4850" in refused.reason


def test_the_evaluation_marks_the_baseline_recipe_only_when_asked():
    evaluation = ModelEvaluation(
        calibration=Calibration(),
        test=_comparison(0.25, 0.05, seed=5),
        backtest=BacktestReport(status="done", windows=WINDOWS, result=_comparison(0.25, 0.05, 6)),
    )
    assert not evaluation.baseline_check().passed
    own = evaluation.baseline_check(own_recipe=True)
    assert own.passed and own.baseline_logloss == evaluation.backtest.result.baseline.logloss
