"""The promotion gate applied to a registered version: check the champion against the baseline
(its manifest's evaluation), judge production on the rows and by the measure the champion was
chosen by, decide, and move the ``production`` alias with a compare-and-swap.

On the backtest basis the gate compares recipes, as the ranking does: production's family and
spec fitted at T-2H and judged on the run's examples at T-H — taken from the contender of this
run with that recipe, or fitted for the gate when none contended. Production's own weights
cannot be judged there: a model fitted after T-H has seen the judged window's outcomes. On the
test split (the backtest skipped) the fitted production model is scored on the same test rows,
customers no run trains on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from infra.storage.registry import ModelManifest, ModelRegistry, PromotionConflict
from tasks.ml.champion import Basis, judged_figures
from tasks.ml.evaluation import ModelEvaluation
from tasks.ml.models import FamilySpec, evaluate, get_family, load_model, spec_adapter
from tasks.ml.promotion import (
    FORCE_HINT,
    GateBasis,
    GateFigures,
    PromotionDecision,
    decide_promotion,
)
from tasks.ml.snapshot_reader import SnapshotStream

log = logging.getLogger(__name__)

RecipeBacktest = Callable[[FamilySpec], GateFigures]
"""Fits a spec in this run's backtest and returns its calibrated figures on the judged rows."""


def gate_and_promote(
    registry: ModelRegistry,
    candidate: ModelManifest,
    contenders: list[ModelManifest],
    data: SnapshotStream,
    margin: float,
    *,
    basis: Basis,
    recipe_backtest: RecipeBacktest,
) -> tuple[PromotionDecision, bool, str | None]:
    """``(decision, promoted, production version the gate saw)`` for ``candidate``, the champion
    of ``contenders`` judged on ``basis`` (``data``: the newest origin's examples, whose test
    split is the test basis); a concurrent promotion between the decision and the alias write
    keeps the candidate out (the reason says so)."""
    production = registry.alias()
    production_version = production.version if production else None
    evaluation = ModelEvaluation.model_validate(candidate.evaluation)
    figures = _figures(evaluation, basis)
    if production_version == candidate.version:
        decision = PromotionDecision(
            promote=False,
            reason=f"{candidate.version} is production already",
            basis=basis,
            candidate_logloss=figures.logloss,
            candidate_auc=figures.auc,
            margin=margin,
        )
    else:
        rows = evaluation.backtest.n_judged if basis == "backtest" else data.rows("test")
        decision = _decide(
            registry,
            production_version,
            candidate,
            figures,
            GateBasis(basis=basis, rows=rows),
            contenders,
            data,
            margin,
            recipe_backtest,
            evaluation,
        )
    promoted = False
    if decision.promote:
        try:
            registry.set_alias(
                candidate.version, decision.reason, expected_version=production_version
            )
            promoted = True
        except PromotionConflict as exc:
            decision = decision.model_copy(update={"promote": False, "reason": str(exc)})
    log.info("model %s: %s", candidate.version, decision.reason)
    if not promoted and production_version is None:
        log.warning(
            "no production model: batch inference and the endpoint have nothing to score with "
            "until a version is promoted (%s)",
            FORCE_HINT,
        )
    return decision, promoted, production_version


def _figures(evaluation: ModelEvaluation, basis: Basis) -> GateFigures:
    judged = judged_figures(evaluation, basis)
    return GateFigures(logloss=judged["logloss"], auc=judged["auc"])


def recipe_spec(manifest: ModelManifest) -> FamilySpec:
    """The family spec a version was fitted with (its manifest's ``training.spec``; versions
    from before it: its family's default spec)."""
    recorded = manifest.training.get("spec")
    if recorded:
        return spec_adapter().validate_python(recorded)
    return get_family(manifest.kind).spec()


def _decide(
    registry: ModelRegistry,
    production_version: str | None,
    candidate: ModelManifest,
    figures: GateFigures,
    basis: GateBasis,
    contenders: list[ModelManifest],
    data: SnapshotStream,
    margin: float,
    recipe_backtest: RecipeBacktest,
    evaluation: ModelEvaluation,
) -> PromotionDecision:
    """Judge production on ``basis`` (when its features match the candidate's) and decide."""
    baseline = evaluation.baseline_check()
    if production_version is None:
        return decide_promotion(figures, None, margin, basis=basis, baseline=baseline)
    prod_manifest, files = registry.read_files(production_version)
    comparable = prod_manifest.features == candidate.features
    production, same_recipe = None, False
    if comparable and basis.basis == "backtest":
        production, same_recipe = _production_recipe(
            prod_manifest, candidate, contenders, recipe_backtest
        )
    elif comparable:
        judged = evaluate(load_model(files, prod_manifest.files), data, "test")
        production = GateFigures(logloss=judged["logloss"], auc=judged["auc"])
    return decide_promotion(
        figures,
        production,
        margin,
        basis=basis,
        production_version=production_version,
        comparable=comparable,
        same_recipe=same_recipe,
        baseline=baseline,
    )


def _production_recipe(
    production: ModelManifest,
    candidate: ModelManifest,
    contenders: list[ModelManifest],
    recipe_backtest: RecipeBacktest,
) -> tuple[GateFigures, bool]:
    """Production's recipe judged in this run's backtest, and whether it is the candidate's."""
    spec = recipe_spec(production)
    for contender in contenders:
        if recipe_spec(contender) == spec:
            evaluation = ModelEvaluation.model_validate(contender.evaluation)
            return _figures(evaluation, "backtest"), contender.version == candidate.version
    log.info(
        "production %s's recipe (%s) did not contend in this run: fitting it in the backtest "
        "for the gate",
        production.version,
        spec.kind,
    )
    return recipe_backtest(spec), False
