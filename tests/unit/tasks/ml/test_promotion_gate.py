"""The gate judges the champion against production on the measure the champion was chosen by:
calibrated log loss on the same rows (the backtest's, or the test split's), a higher AUC breaking
a tie — not test AUC. On the backtest, production is its recipe (family and spec) fitted at T-2H:
the contender of the run with that recipe, or a fit for the gate when none contended."""

from __future__ import annotations

import datetime as dt

import numpy as np

from infra.storage.registry import ModelManifest, ModelRegistry
from infra.storage.store import LocalFolderStore
from tasks.ml.calibration import Calibration
from tasks.ml.evaluation import BacktestReport, BacktestWindows, ModelComparison, ModelEvaluation
from tasks.ml.gate import _production_recipe, gate_and_promote, recipe_spec
from tasks.ml.metrics import quality_metrics
from tasks.ml.models import CONFIG_FILE, FamilySpec, get_family
from tasks.ml.promotion import BaselineCheck, GateBasis, GateFigures, decide_promotion

BACKTEST = GateBasis(basis="backtest", rows=12_345)


def _fig(logloss: float, auc: float) -> GateFigures:
    return GateFigures(logloss=logloss, auc=auc)


def test_lower_log_loss_wins_though_production_has_the_higher_auc():
    decision = decide_promotion(
        _fig(0.3000, 0.79), _fig(0.3100, 0.81), 0.0, basis=BACKTEST, production_version="m-1"
    )
    assert decision.promote
    assert decision.basis == "backtest" and decision.production_logloss == 0.31
    assert "calibrated log loss on the same 12,345 customers in the backtest" in decision.reason
    assert "candidate 0.3000 (AUC 0.7900), production m-1 0.3100 (AUC 0.8100)" in decision.reason
    assert "gain +0.0100" in decision.reason


def test_higher_log_loss_keeps_production_though_the_candidate_has_the_higher_auc():
    decision = decide_promotion(
        _fig(0.3200, 0.85), _fig(0.3100, 0.80), 0.0, basis=BACKTEST, production_version="m-1"
    )
    assert not decision.promote
    assert "does not beat production m-1 on calibrated log loss" in decision.reason


def test_a_log_loss_tie_is_broken_by_auc():
    tied = 0.3000004
    higher = decide_promotion(
        _fig(tied, 0.81), _fig(0.3000001, 0.80), 0.0, basis=BACKTEST, production_version="m-1"
    )
    lower = decide_promotion(
        _fig(tied, 0.79), _fig(0.3000001, 0.80), 0.0, basis=BACKTEST, production_version="m-1"
    )
    same = decide_promotion(
        _fig(tied, 0.80), _fig(tied, 0.80), 0.0, basis=BACKTEST, production_version="m-1"
    )
    assert higher.promote and not lower.promote and not same.promote
    assert "AUC breaking a tie" in higher.reason


def test_the_margin_is_a_log_loss_gain():
    prod = _fig(0.3100, 0.80)
    small = decide_promotion(_fig(0.3050, 0.80), prod, 0.01, production_version="m-1")
    large = decide_promotion(_fig(0.2950, 0.80), prod, 0.01, production_version="m-1")
    tie_higher_auc = decide_promotion(_fig(0.3100, 0.90), prod, 0.01, production_version="m-1")
    assert not small.promote and large.promote and not tie_higher_auc.promote
    assert "required more than 0.0100" in small.reason


def test_the_same_recipe_fitted_on_newer_data_is_promoted():
    figures = _fig(0.3000, 0.80)
    decision = decide_promotion(
        figures, figures, 0.0, basis=BACKTEST, production_version="m-1", same_recipe=True
    )
    assert decision.promote and "production m-1's recipe" in decision.reason
    assert "calibrated log loss" in decision.reason


def test_the_reason_names_the_test_split_when_the_backtest_was_skipped():
    decision = decide_promotion(
        _fig(0.30, 0.80),
        _fig(0.31, 0.80),
        0.0,
        basis=GateBasis(basis="test split", rows=500),
        production_version="m-1",
    )
    assert decision.promote and decision.basis == "test split"
    assert "calibrated log loss on the same 500 customers in the test split" in decision.reason


def test_first_model_other_features_and_the_baseline():
    assert "first model" in decide_promotion(_fig(0.3, 0.8), None, 0.0).reason
    other = decide_promotion(_fig(0.3, 0.8), None, 0.0, production_version="m-1", comparable=False)
    assert other.promote and "cannot be compared" in other.reason
    lost = BaselineCheck(basis="backtest", model_logloss=0.35, baseline_logloss=0.34)
    kept = decide_promotion(
        _fig(0.35, 0.8), _fig(0.40, 0.7), 0.0, production_version="m-1", baseline=lost
    )
    assert not kept.promote and "does not beat the RFM baseline" in kept.reason


def _evaluation(noise: float, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.02, 0.98, 2000)
    y = (rng.uniform(size=p.size) < p).astype(float)
    q = quality_metrics(y, np.clip(p + rng.normal(0, noise, p.size), 0.01, 0.99))
    comparison = ModelComparison(model=q, model_uncalibrated=q, baseline=q)
    windows = BacktestWindows.of(dt.date(2025, 12, 31), 90)
    report = BacktestReport(status="done", windows=windows, n_judged=2000, result=comparison)
    evaluation = ModelEvaluation(calibration=Calibration(), test=comparison, backtest=report)
    return evaluation.model_dump(mode="json")


def _manifest(version: str, spec: FamilySpec | None, noise: float = 0.1) -> ModelManifest:
    training = {"spec": spec.model_dump(mode="json")} if spec is not None else {}
    return ModelManifest(
        version=version,
        created_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        kind=spec.kind if spec is not None else "mlp",
        files={},
        training=training,
        evaluation=_evaluation(noise, seed=len(version)),
    )


class _Fits:
    """The gate's backtest fit of a recipe no contender had (records what it was asked)."""

    def __init__(self) -> None:
        self.specs: list[FamilySpec] = []

    def __call__(self, spec: FamilySpec) -> GateFigures:
        self.specs.append(spec)
        return _fig(0.5, 0.6)


def test_production_is_judged_as_the_contender_with_its_recipe():
    gbm, logistic = get_family("gbm").spec(), get_family("logistic").spec()
    champion = _manifest("m-logistic", logistic, noise=0.05)
    runner_up = _manifest("m-gbm", gbm, noise=0.2)
    production = _manifest("m-prod", gbm)
    fits = _Fits()
    figures, same = _production_recipe(production, champion, [champion, runner_up], fits)
    judged = ModelEvaluation.model_validate(runner_up.evaluation).backtest.result.model
    assert (figures.logloss, figures.auc) == (judged.logloss, judged.auc)
    assert not same and fits.specs == []
    figures, same = _production_recipe(production, runner_up, [champion, runner_up], fits)
    assert same


def test_a_recipe_that_did_not_contend_is_fitted_for_the_gate():
    tuned = get_family("gbm").spec({"num_leaves": 7})
    production = _manifest("m-prod", tuned)
    champion = _manifest("m-gbm", get_family("gbm").spec())
    fits = _Fits()
    figures, same = _production_recipe(production, champion, [champion], fits)
    assert fits.specs == [tuned] and figures == _fig(0.5, 0.6) and not same


def test_a_version_from_before_families_is_the_default_mlp():
    assert recipe_spec(_manifest("m-old", None)) == get_family("mlp").spec()


def _judged(version: str, kind: str, logloss: float, baseline_logloss: float) -> dict:
    """An evaluation whose calibrated backtest log loss is ``logloss`` against the baseline's."""
    base = ModelEvaluation.model_validate(_evaluation(0.1, seed=3))
    result = base.backtest.result
    result = result.model_copy(
        update={
            "model": result.model.model_copy(update={"logloss": logloss}),
            "baseline": result.baseline.model_copy(update={"logloss": baseline_logloss}),
        }
    )
    backtest = base.backtest.model_copy(update={"result": result})
    return {
        "version": version,
        "kind": kind,
        "features": ["a", "b"],
        "training": {"spec": get_family(kind).spec().model_dump(mode="json")},
        "evaluation": base.model_copy(update={"backtest": backtest}).model_dump(mode="json"),
    }


def _gate(tmp_path, champion: str, versions: list[dict]):
    registry = ModelRegistry(LocalFolderStore(tmp_path / "store"))
    manifests = {v["version"]: registry.register({CONFIG_FILE: b"{}"}, **v) for v in versions}
    outcome = gate_and_promote(
        registry,
        manifests[champion],
        list(manifests.values()),
        None,  # the backtest basis with no production reads no rows
        0.0,
        basis="backtest",
        recipe_backtest=_Fits(),
    )
    return registry, outcome


def test_an_rfm_champion_is_promoted_as_the_first_model(tmp_path):
    registry, outcome = _gate(
        tmp_path,
        "m-rfm",
        [_judged("m-rfm", "rfm", 0.4853, 0.4850), _judged("m-gbm", "gbm", 0.4870, 0.4850)],
    )
    assert outcome.promoted and outcome.candidate.version == "m-rfm"
    assert registry.alias().version == "m-rfm"
    assert "RFM baseline's own recipe" in outcome.decision.reason


def test_a_champion_refused_by_the_baseline_gives_its_place_to_the_rfm_contender(tmp_path):
    """gbm out-ranks the calibrated rfm but not the raw baseline: it stays out, and the run's
    rfm contender, judged by every other rule, is served instead of nothing."""
    registry, outcome = _gate(
        tmp_path,
        "m-gbm",
        [_judged("m-gbm", "gbm", 0.4851, 0.4850), _judged("m-rfm", "rfm", 0.4853, 0.4850)],
    )
    assert outcome.promoted and outcome.candidate.version == "m-rfm"
    assert registry.alias().version == "m-rfm"
    reason = outcome.decision.reason
    assert reason.startswith("champion m-gbm (gbm) refused: candidate backtest log loss 0.4851 ")
    assert "does not beat the RFM baseline's 0.4850" in reason
    assert "in its place the run's rfm contender m-rfm: first model" in reason


def test_a_champion_that_loses_to_the_baseline_is_refused_without_an_rfm_contender(tmp_path):
    registry, outcome = _gate(
        tmp_path,
        "m-gbm",
        [_judged("m-gbm", "gbm", 0.4851, 0.4850), _judged("m-mlp", "mlp", 0.4900, 0.4850)],
    )
    assert not outcome.promoted and outcome.candidate.version == "m-gbm"
    assert registry.alias() is None
    assert "does not beat the RFM baseline's 0.4850" in outcome.decision.reason
