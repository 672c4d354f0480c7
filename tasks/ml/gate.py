"""The promotion gate applied to a registered version: check the champion against the baseline
(its manifest's evaluation), judge production on the rows and by the measure the champion was
chosen by, decide, and move the ``production`` alias with a compare-and-swap.

On the backtest basis the gate compares recipes, as the ranking does: production's family and
spec fitted at T-2H and judged on the run's examples at T-H — taken from the contender of this
run with that recipe, or fitted for the gate when none contended. Production's own weights
cannot be judged there: a model fitted after T-H has seen the judged window's outcomes. On the
test split (the backtest skipped) the fitted production model is scored on the same test rows,
customers no run trains on.

The baseline rule has one exception and one consequence: a champion of the baseline's own recipe
(family ``rfm``) meets it by definition, and a champion of another family refused by it alone
gives its place to the run's ``rfm`` contender, judged by every other rule.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from infra.storage.registry import ModelManifest, ModelRegistry, PromotionConflict
from tasks.ml.baseline import BASELINE_FAMILY
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


@dataclass(frozen=True)
class GateOutcome:
    """What the gate did: the version it decided on (the champion, or the run's ``rfm``
    contender in its place), the decision, whether the alias moved, and the production version
    it saw."""

    candidate: ModelManifest
    decision: PromotionDecision
    promoted: bool
    production_version: str | None


def gate_and_promote(
    registry: ModelRegistry,
    candidate: ModelManifest,
    contenders: list[ModelManifest],
    data: SnapshotStream,
    margin: float,
    *,
    basis: Basis,
    recipe_backtest: RecipeBacktest,
) -> GateOutcome:
    """Decide on ``candidate``, the champion of ``contenders`` judged on ``basis`` (``data``: the
    newest origin's examples, whose test split is the test basis), and promote it if the
    decision says so. A champion refused by the baseline rule alone gives its place to the
    run's contender of the baseline's own recipe (:func:`baseline_recipe_in_place`), judged by
    every other rule: a run never ends with nothing better than the baseline to serve while it
    fitted the baseline's recipe. A concurrent promotion between the decision and the alias
    write keeps the candidate out (the reason says so)."""
    production = registry.alias()
    production_version = production.version if production else None
    judge = partial(
        _judge,
        registry,
        production_version,
        contenders=contenders,
        data=data,
        margin=margin,
        basis=basis,
        recipe_backtest=recipe_backtest,
    )
    decision = judge(candidate)
    in_place = baseline_recipe_in_place(candidate, contenders, decision)
    if in_place is not None:
        log.info(
            "champion %s (%s): %s; judging the run's %s contender %s in its place",
            candidate.version,
            candidate.kind,
            decision.reason,
            in_place.kind,
            in_place.version,
        )
        second = judge(in_place)
        reason = (
            f"champion {candidate.version} ({candidate.kind}) refused: {decision.reason}; "
            f"in its place the run's {in_place.kind} contender {in_place.version}: "
            f"{second.reason}"
        )
        decision, candidate = second.model_copy(update={"reason": reason}), in_place
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
    return GateOutcome(candidate, decision, promoted, production_version)


def baseline_recipe_in_place(
    champion: ModelManifest, contenders: list[ModelManifest], decision: PromotionDecision
) -> ModelManifest | None:
    """The run's contender of the baseline's recipe (family ``rfm``) when ``decision`` refused
    ``champion``, another family, for not beating the baseline; else None."""
    refused_by_baseline = (
        not decision.promote and decision.baseline is not None and not decision.baseline.passed
    )
    if not refused_by_baseline or champion.kind == BASELINE_FAMILY:
        return None
    return next((c for c in contenders if c.kind == BASELINE_FAMILY), None)


def _judge(
    registry: ModelRegistry,
    production_version: str | None,
    candidate: ModelManifest,
    *,
    contenders: list[ModelManifest],
    data: SnapshotStream,
    margin: float,
    basis: Basis,
    recipe_backtest: RecipeBacktest,
) -> PromotionDecision:
    """The gate's decision on ``candidate`` (nothing promoted yet)."""
    evaluation = ModelEvaluation.model_validate(candidate.evaluation)
    figures = _figures(evaluation, basis)
    if production_version == candidate.version:
        return PromotionDecision(
            promote=False,
            reason=f"{candidate.version} is production already",
            basis=basis,
            candidate_logloss=figures.logloss,
            candidate_auc=figures.auc,
            margin=margin,
        )
    rows = evaluation.backtest.n_judged if basis == "backtest" else data.rows("test")
    return _decide(
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
    baseline = evaluation.baseline_check(own_recipe=candidate.kind == BASELINE_FAMILY)
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
