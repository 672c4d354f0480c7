"""The refresh policy: horizon choice and the operator's forced promotion, on a real registry."""

from __future__ import annotations

import pytest

from infra.storage.registry import ModelRegistry, PromotionConflict
from tasks.policy.refresh import apply_promotion_mode, production_manifest, refresh_horizon
from tasks.reporting.records import StageReport, TrainResult
from tests.fixtures.serving_sample import register_sample_model, sample_feature_table


def _trained(candidate: str, production: str | None, promoted: bool) -> TrainResult:
    return TrainResult(
        report=StageReport(name="train", seconds=1.0),
        model_version=candidate,
        promoted=promoted,
        decision_reason="candidate AUC 0.61 does not beat production AUC 0.62",
        production_version=production,
        metrics={"auc": 0.61},
        n_train=10,
        n_test=5,
        epochs=1,
        best_epoch=1,
    )


@pytest.fixture
def registry(local_store):
    return ModelRegistry(local_store)


def test_horizon_follows_production_unless_asked(registry, local_store):
    assert refresh_horizon(None, None, 90) == 90
    register_sample_model(local_store, sample_feature_table(20), seed=1)
    production = production_manifest(registry)
    assert production.horizon_days == 90
    assert refresh_horizon(None, production.model_copy(update={"horizon_days": 30}), 90) == 30
    assert refresh_horizon(14, production, 90) == 14


def test_if_better_keeps_the_gates_verdict(registry, local_store):
    table = sample_feature_table(20)
    v1 = register_sample_model(local_store, table, seed=1)
    v2 = register_sample_model(local_store, table, seed=2, promote=False)
    promoted, forced, reason = apply_promotion_mode(registry, _trained(v2, v1, False), "if-better")
    assert (promoted, forced) == (False, False) and "does not beat" in reason
    assert registry.alias().version == v1


def test_always_forces_the_candidate_in_and_records_why(registry, local_store):
    table = sample_feature_table(20)
    v1 = register_sample_model(local_store, table, seed=1)
    v2 = register_sample_model(local_store, table, seed=2, promote=False)
    promoted, forced, reason = apply_promotion_mode(registry, _trained(v2, v1, False), "always")
    assert (promoted, forced) == (True, True)
    record = registry.alias()
    assert record.version == v2 and "forced by operator" in record.history[-1].reason


def test_always_never_overwrites_a_concurrent_promotion(registry, local_store):
    table = sample_feature_table(20)
    v1 = register_sample_model(local_store, table, seed=1)
    v2 = register_sample_model(local_store, table, seed=2, promote=False)
    v3 = register_sample_model(local_store, table, seed=3)  # someone else promoted meanwhile
    with pytest.raises(PromotionConflict):
        apply_promotion_mode(registry, _trained(v2, v1, False), "always")
    assert registry.alias().version == v3


def test_a_refresh_needs_a_production_model(registry, local_store):
    from infra.errors import HybridflowInputError
    from tasks.policy.refresh import require_production

    with pytest.raises(HybridflowInputError, match="no production model to refresh yet"):
        require_production(production_manifest(registry))
    register_sample_model(local_store, sample_feature_table(20), seed=1)
    assert require_production(production_manifest(registry)).horizon_days == 90
