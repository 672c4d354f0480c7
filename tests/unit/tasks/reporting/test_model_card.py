"""The model card and the promotion gate's reasons."""

from __future__ import annotations

import base64
import datetime as dt
import re
from xml.etree import ElementTree

import numpy as np
import pytest

from infra.storage.registry import ModelManifest
from tasks.ml.calibration import Calibration
from tasks.ml.evaluation import (
    BacktestReport,
    BacktestWindows,
    CalibrationScore,
    ModelComparison,
    ModelEvaluation,
)
from tasks.ml.metrics import LiftGroup, ReliabilityBin, quality_metrics
from tasks.ml.promotion import BaselineCheck, GateFigures, decide_promotion
from tasks.reporting.card_charts import (
    BOTTOM,
    HEIGHT,
    LEFT,
    RIGHT,
    TOP,
    WIDTH,
    lift_svg,
    reliability_svg,
)
from tasks.reporting.model_card import model_card_markdown, quality_sections
from tasks.reporting.records import FeaturesResult, StageReport, TrainResult


def test_model_card_tells_decision_lineage_training_and_checksums():
    metrics = {"auc": 0.83, "pr_auc": 0.7, "logloss": 0.4, "positive_rate": 0.3}
    decision = decide_promotion(
        GateFigures(logloss=0.30, auc=0.83),
        GateFigures(logloss=0.32, auc=0.81),
        0.01,
        production_version="m-old",
    )
    result = TrainResult(
        report=StageReport(name="train", seconds=1.0),
        model_version="m-new",
        promoted=True,
        decision_reason=decision.reason,
        production_version="m-old",
        metrics=metrics,
        n_train=700,
        n_test=150,
        epochs=5,
        best_epoch=3,
        training_id="t-abc",
        warm_start=True,
        parent_version="m-old",
        resumed_from_step=120,
        steps=300,
        checkpoints_uri="s3://b/checkpoints/t-abc",
    )
    features = FeaturesResult(
        report=StageReport(name="features", seconds=1.0),
        as_of=dt.date(2025, 12, 31),
        horizon_days=90,
        features=["f1", "f2"],
        training_prefix="t",
        scoring_prefix="s",
        n_training=1000,
        n_scoring=1000,
        positive_rate=0.3,
        events_after_as_of=0,
    )
    manifest = ModelManifest(
        version="m-new",
        created_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        files={"model.pt": "ab" * 32},
        features=["f1", "f2"],
        data_fingerprint="fp123",
        parent_version="m-old",
        warm_start=True,
        training_id="t-abc",
        code_version="hybridflow-0.1.0",
        training={"device": "cpu", "world_size": 2, "learning_rate": 0.0004},
    )
    card = model_card_markdown(result, decision, features, manifest, "s3://b/models/versions")
    assert "**Promoted:** yes — candidate beats production m-old on calibrated log loss" in card
    assert "| production log loss (AUC) | 0.3200 (0.8100) |" in card
    assert "| candidate log loss (AUC) | 0.3000 (0.8300) |" in card
    assert "| required log loss gain | 0.0100 |" in card
    assert "warm start from m-old" in card and "resumed from checkpoint step 120" in card
    assert "`model.pt` sha256 `" + "ab" * 32 in card and "fp123" in card
    assert "processes: 2" in card and "hybridflow-0.1.0" in card and "f1, f2" in card


def test_model_card_shows_backtest_baseline_reliability_and_inline_charts():
    rng = np.random.default_rng(0)
    p = rng.uniform(0.01, 0.9, 2000)
    y = (rng.uniform(size=p.size) < p).astype(float)
    comparison = ModelComparison(
        model=quality_metrics(y, p),
        model_uncalibrated=quality_metrics(y, p**2),
        baseline=quality_metrics(y, np.clip(p + rng.normal(0, 0.2, p.size), 0.01, 0.99)),
        calibration_methods={
            "platt": CalibrationScore(logloss=0.5, brier=0.2, ece=0.01, mean_score=0.45)
        },
    )
    evaluation = ModelEvaluation(
        calibration=Calibration(method="platt", slope=1.1, intercept=-0.2, fitted_rows=300),
        test=comparison,
        backtest=BacktestReport(
            status="done",
            windows=BacktestWindows.of(dt.date(2025, 12, 31), 90),
            n_train=900,
            n_judged=1500,
            result=comparison,
        ),
    )
    check = BaselineCheck(
        basis="backtest",
        model_logloss=comparison.model.logloss,
        baseline_logloss=comparison.baseline.logloss,
    )
    decision = decide_promotion(GateFigures(logloss=0.30, auc=0.83), None, 0.0, baseline=check)
    result = TrainResult(
        report=StageReport(name="train", seconds=1.0),
        model_version="m-new",
        promoted=decision.promote,
        decision_reason=decision.reason,
        production_version=None,
        metrics={"auc": 0.83, "pr_auc": 0.7, "logloss": 0.4, "positive_rate": 0.3},
        n_train=700,
        n_test=150,
        epochs=5,
        best_epoch=3,
        evaluation=evaluation,
    )
    features = FeaturesResult(
        report=StageReport(name="features", seconds=1.0),
        as_of=dt.date(2025, 12, 31),
        horizon_days=90,
        features=["f1"],
        training_prefix="t",
        scoring_prefix="s",
        n_training=1000,
        n_scoring=1000,
        positive_rate=0.3,
        events_after_as_of=0,
    )
    manifest = ModelManifest(
        version="m-new", created_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), files={}
    )
    card = model_card_markdown(result, decision, features, manifest, "/store/models/versions")
    assert "## Out-of-time backtest" in card and "Trained the same way at 2025-07-04" in card
    assert "judged on the 1500 customers at 2025-10-02" in card
    assert "| | model | model (raw) | baseline |" in card
    assert f"| log loss | {comparison.model.logloss:.4f} | " in card
    assert "| expected calibration error |" in card and "| top-decile lift |" in card
    assert "Platt sigmoid(1.1000 z -0.2000) on 300 held-out rows" in card
    assert "beats the RFM baseline" in card and "| [0.9, 1.0) |" in card
    images = re.findall(r"!\[([^\]]+)\]\(data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", card)
    assert [alt for alt, _ in images] == ["reliability plot (backtest)", "lift chart (backtest)"]
    reliability, lift = (ElementTree.fromstring(base64.b64decode(data)) for _, data in images)
    assert _title(reliability) == "Reliability (backtest)"
    lines = {e.get("data-model"): e for e in reliability.iter(f"{SVG}polyline")}
    assert set(lines) == {None, "model", "model (raw)", "baseline"}  # None: the diagonal
    filled = [b for b in comparison.model.reliability if b.mean_score is not None]
    assert len(lines["model"].get("points").split()) == len(filled) > 3
    assert _title(lift) == "Lift by score decile (backtest)"
    bars = [e.get("data-model") for e in lift.iter(f"{SVG}rect") if e.get("class") == "bar"]
    assert bars.count("model") == bars.count("baseline") == len(comparison.model.lift) == 10


SVG = "{http://www.w3.org/2000/svg}"


def _title(svg: ElementTree.Element) -> str:
    return next(svg.iter(f"{SVG}text")).text


def test_the_charts_place_points_and_bars_by_their_values():
    bins = [
        ReliabilityBin(lower=0.0, upper=0.5, n=10, mean_score=0.25, observed_rate=0.5),
        ReliabilityBin(lower=0.5, upper=1.0, n=0, mean_score=None, observed_rate=None),
    ]
    svg = ElementTree.fromstring(reliability_svg({"model": bins}, "t"))
    (line,) = [e for e in svg.iter(f"{SVG}polyline") if e.get("data-model") == "model"]
    ((x, y),) = [tuple(map(float, p.split(","))) for p in line.get("points").split()]
    assert x == pytest.approx(LEFT + 0.25 * (WIDTH - LEFT - RIGHT), abs=0.1)
    assert y == pytest.approx(HEIGHT - BOTTOM - 0.5 * (HEIGHT - TOP - BOTTOM), abs=0.1)
    groups = [
        LiftGroup(decile=d, n=10, mean_score=0.5, observed_rate=0.5, lift=lift, cumulative_gain=0)
        for d, lift in ((1, 2.3), (2, 1.0), (3, 0.0))
    ]
    svg = ElementTree.fromstring(lift_svg({"model": groups}, "t"))
    heights = [float(e.get("height")) for e in svg.iter(f"{SVG}rect") if e.get("class") == "bar"]
    axis = HEIGHT - TOP - BOTTOM  # the axis ends at 2.5, the nice number above 2.3 x 1.05
    assert heights == pytest.approx([axis * 2.3 / 2.5, axis * 1.0 / 2.5, 0.0], abs=0.1)


def test_model_card_says_when_the_backtest_was_skipped():
    y = np.array([0, 1] * 50, dtype=float)
    q = quality_metrics(y, np.linspace(0.1, 0.9, 100))
    evaluation = ModelEvaluation(
        calibration=Calibration(),
        test=ModelComparison(model=q, model_uncalibrated=q, baseline=q),
        backtest=BacktestReport(
            status="skipped",
            reason="history too short for the backtest: it would train at 2025-07-04",
            windows=BacktestWindows.of(dt.date(2025, 12, 31), 90),
        ),
    )
    text = "\n".join(quality_sections(evaluation, 70, 15, {}))
    assert "**Skipped:** history too short for the backtest" in text
    assert "## Reliability and lift (test split)" in text and "lift chart (test split)" in text
