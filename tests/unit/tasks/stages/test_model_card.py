"""The model card and the promotion gate's reasons."""

from __future__ import annotations

import datetime as dt

from infra.registry import ModelManifest
from tasks.ml.promotion import decide_promotion
from tasks.stages.model_card import model_card_markdown
from tasks.stages.records import FeaturesResult, StageReport, TrainResult


def test_gate_needs_more_than_the_margin_on_the_same_test_set():
    assert decide_promotion(0.80, None, 0.01).promote
    close = decide_promotion(0.805, 0.80, 0.01, production_version="m-1")
    assert not close.promote and "does not beat production m-1" in close.reason
    better = decide_promotion(0.82, 0.80, 0.01, production_version="m-1")
    assert better.promote and "gain +0.0200" in better.reason


def test_model_card_tells_decision_lineage_training_and_checksums():
    metrics = {"auc": 0.83, "pr_auc": 0.7, "logloss": 0.4, "positive_rate": 0.3}
    decision = decide_promotion(0.83, 0.81, 0.01, production_version="m-old")
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
    assert "**Promoted:** yes — candidate AUC 0.8300 beats production m-old" in card
    assert "| production test AUC (same test set) | 0.8100 |" in card
    assert "| required margin | 0.0100 |" in card
    assert "warm start from m-old" in card and "resumed from checkpoint step 120" in card
    assert "`model.pt` sha256 `" + "ab" * 32 in card and "fp123" in card
    assert "processes: 2" in card and "hybridflow-0.1.0" in card and "f1, f2" in card
