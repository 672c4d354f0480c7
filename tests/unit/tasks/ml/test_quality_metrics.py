"""Reliability table, calibration error, Brier score and lift on hand-checkable inputs."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.ml.metrics import (
    brier_score,
    expected_calibration_error,
    lift_table,
    pr_auc,
    probability_metrics,
    quality_metrics,
    reliability_table,
    roc_auc,
)


def test_reliability_bins_and_ece_by_hand():
    p = np.array([0.05, 0.05, 0.15, 0.95, 1.0])
    y = np.array([0, 1, 0, 1, 1])
    table = reliability_table(y, p)
    assert len(table) == 10 and [b.n for b in table] == [2, 1, 0, 0, 0, 0, 0, 0, 0, 2]
    assert table[0].mean_score == pytest.approx(0.05) and table[0].observed_rate == 0.5
    assert table[2].mean_score is None and table[2].observed_rate is None
    assert table[9].mean_score == pytest.approx(0.975) and table[9].observed_rate == 1.0
    # |0.05-0.5|*2 + |0.15-0|*1 + |0.975-1|*2, over 5 rows
    assert expected_calibration_error(table) == pytest.approx((0.9 + 0.15 + 0.05) / 5)


def test_brier_and_lift_by_hand():
    y = np.array([1, 0, 0, 0, 1, 0, 0, 0, 0, 0] * 2)
    p = np.linspace(0.95, 0.0, 20)  # sorted high to low already
    assert brier_score(np.array([1, 0]), np.array([0.8, 0.3])) == pytest.approx((0.04 + 0.09) / 2)
    lift = lift_table(y, p)
    assert [g.n for g in lift] == [2] * 10
    # top decile = rows 0-1: one positive of two, base rate 4/20
    assert lift[0].observed_rate == 0.5 and lift[0].lift == pytest.approx(2.5)
    assert lift[-1].cumulative_gain == pytest.approx(1.0)


def test_perfectly_calibrated_scores_have_small_ece_and_bad_ones_do_not():
    rng = np.random.default_rng(0)
    p = rng.uniform(size=50_000)
    y = (rng.uniform(size=p.size) < p).astype(float)
    good = quality_metrics(y, p)
    bad = quality_metrics(y, p**3)  # same ranking, scores far too low
    assert good.ece < 0.01 and bad.ece > 0.1
    assert good.auc == pytest.approx(bad.auc) and good.logloss < bad.logloss
    assert good.top_decile_lift == pytest.approx(bad.top_decile_lift)
    assert set(good.headline()) >= {"auc", "pr_auc", "logloss", "brier", "ece", "top_decile_lift"}


def test_one_sort_gives_the_figures_each_metric_gives_alone_and_probability_metrics_agree():
    rng = np.random.default_rng(3)
    y = (rng.random(5000) < 0.3).astype(float)
    p = np.round(np.clip(rng.random(5000) * 0.5 + 0.5 * y * rng.random(5000), 0, 1), 2)
    q = quality_metrics(y, p)
    assert q.auc == pytest.approx(roc_auc(y, p), abs=1e-12)
    assert q.pr_auc == pytest.approx(pr_auc(y, p), abs=1e-12)
    assert q.lift == lift_table(y, p)
    light = probability_metrics(y, p)
    assert light.model_dump() == {
        "logloss": q.logloss,
        "brier": q.brier,
        "ece": q.ece,
        "mean_score": q.mean_score,
    }
