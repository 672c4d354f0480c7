"""Calibration restores a known miscalibration; the maps are monotone and round-trip as JSON."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.ml.calibration import Calibration, calibration_that_pays, fit_calibration
from tasks.ml.logistic import sigmoid
from tasks.ml.metrics import log_loss, quality_metrics


def _miscalibrated(n: int, squash: float, shift: float, seed: int):
    """True logits z*, outcomes drawn from sigmoid(z*), and a model that reports
    ``squash * z* + shift`` (squashed, biased): the map back is known."""
    rng = np.random.default_rng(seed)
    true_logit = rng.normal(-1.0, 1.5, size=n)
    y = (rng.uniform(size=n) < sigmoid(true_logit)).astype(float)
    return true_logit, y, squash * true_logit + shift


@pytest.mark.parametrize("method", ["platt", "isotonic"])
def test_squashed_and_shifted_logits_are_restored(method):
    true_logit, y, reported = _miscalibrated(40_000, squash=0.4, shift=-0.8, seed=1)
    held_out, judged = slice(0, 20_000), slice(20_000, None)
    raw = quality_metrics(y[judged], sigmoid(reported[judged]))
    calibration = fit_calibration(reported[held_out], y[held_out], method)
    fixed = quality_metrics(y[judged], calibration.probabilities(reported[judged]))
    truth = quality_metrics(y[judged], sigmoid(true_logit[judged]))
    assert raw.ece > 0.05  # the planted miscalibration is visible
    assert fixed.ece < 0.015, fixed.ece
    assert abs(fixed.mean_score - fixed.positive_rate) < 0.01
    assert fixed.logloss < raw.logloss and fixed.logloss == pytest.approx(truth.logloss, abs=0.005)
    if method == "platt":  # the inverse map: slope 1/0.4, intercept 0.8/0.4
        assert calibration.slope == pytest.approx(2.5, rel=0.06)
        assert calibration.intercept == pytest.approx(2.0, rel=0.08)


def test_temperature_fixes_confidence_but_not_a_shifted_base_rate():
    true_logit, y, reported = _miscalibrated(40_000, squash=2.5, shift=0.0, seed=2)
    calibration = fit_calibration(reported[:20_000], y[:20_000], "temperature")
    assert 1 / calibration.slope == pytest.approx(2.5, rel=0.06)  # T undoes the over-confidence
    fixed = quality_metrics(y[20_000:], calibration.probabilities(reported[20_000:]))
    assert fixed.ece < 0.015
    _, y2, shifted = _miscalibrated(40_000, squash=1.0, shift=-1.0, seed=3)
    only_scale = fit_calibration(shifted[:20_000], y2[:20_000], "temperature")
    platt = fit_calibration(shifted[:20_000], y2[:20_000], "platt")
    judged = y2[20_000:], shifted[20_000:]
    assert log_loss(judged[0], platt.probabilities(judged[1])) < log_loss(
        judged[0], only_scale.probabilities(judged[1])
    )


def test_maps_are_monotone_bounded_and_survive_json():
    _, y, reported = _miscalibrated(5_000, squash=0.7, shift=0.3, seed=4)
    grid = np.linspace(-8, 8, 401)
    for method in ("none", "temperature", "platt", "isotonic"):
        calibration = fit_calibration(reported, y, method)
        p = calibration.probabilities(grid)
        assert np.all(np.diff(p) >= 0) and np.all((p > 0) & (p < 1)), method
        again = Calibration.model_validate_json(calibration.model_dump_json())
        np.testing.assert_array_equal(again.probabilities(grid), p)
    assert Calibration().probabilities(np.array([0.0]))[0] == 0.5  # identity: the raw sigmoid


def test_calibration_needs_both_classes():
    with pytest.raises(ValueError, match="both classes"):
        fit_calibration(np.array([0.1, 0.2, 0.3]), np.zeros(3), "platt")


def test_a_map_is_kept_only_where_cross_validation_shows_it_pays():
    # a calibrated model on a few hundred rows: a fitted temperature only fits their noise
    calibrated_rows = 0
    for seed in range(10):
        _, y, reported = _miscalibrated(400, squash=1.0, shift=0.0, seed=10 + seed)
        kept = calibration_that_pays(reported, y, "temperature")
        calibrated_rows += kept.method != "none"
        if kept.method == "none":
            assert kept.declined.startswith("temperature did not pay on 400 held-out rows")
            assert kept.describe().startswith("none (temperature did not pay")
            assert kept.probabilities(np.array([0.0]))[0] == 0.5
    assert calibrated_rows <= 1
    # a real over-confidence is corrected, from few rows too
    for n in (400, 20_000):
        _, y, reported = _miscalibrated(n, squash=2.5, shift=0.0, seed=5)
        kept = calibration_that_pays(reported, y, "temperature")
        assert kept.method == "temperature" and 1 / kept.slope == pytest.approx(2.5, rel=0.25)
        assert kept == fit_calibration(reported, y, "temperature")  # all rows, same fit
    # the same rows always decide the same
    _, y, reported = _miscalibrated(400, squash=1.3, shift=0.0, seed=6)
    assert calibration_that_pays(reported, y, "platt") == calibration_that_pays(
        reported, y, "platt"
    )
    assert calibration_that_pays(reported, y, "none") == Calibration()
