"""The promotion gate applied to a registered version: check the candidate against the baseline
(its manifest's evaluation), evaluate production on the candidate's test split (calibrated
scores), decide, and move the ``production`` alias with a compare-and-swap."""

from __future__ import annotations

import logging

from infra.registry import ModelManifest, ModelRegistry, PromotionConflict
from tasks.ml.evaluation import ModelEvaluation
from tasks.ml.models import evaluate, load_model
from tasks.ml.promotion import FORCE_HINT, PromotionDecision, decide_promotion
from tasks.ml.snapshot_reader import SnapshotStream

log = logging.getLogger(__name__)


def gate_and_promote(
    registry: ModelRegistry, candidate: ModelManifest, data: SnapshotStream, margin: float
) -> tuple[PromotionDecision, bool, str | None]:
    """``(decision, promoted, production version the gate saw)``; a concurrent promotion
    between the decision and the alias write keeps the candidate out (the reason says so)."""
    production = registry.alias()
    production_version = production.version if production else None
    if production_version == candidate.version:
        decision = PromotionDecision(
            promote=False,
            reason=f"{candidate.version} is production already",
            candidate_auc=candidate.metrics["test_auc"],
            margin=margin,
        )
    else:
        decision = _decide(registry, production_version, candidate, data, margin)
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


def _decide(
    registry: ModelRegistry,
    production_version: str | None,
    candidate: ModelManifest,
    data: SnapshotStream,
    margin: float,
) -> PromotionDecision:
    """Evaluate production on the candidate's test split (when features match) and decide."""
    candidate_auc = candidate.metrics["test_auc"]
    baseline = (
        ModelEvaluation.model_validate(candidate.evaluation).baseline_check()
        if candidate.evaluation
        else None
    )
    if production_version is None:
        return decide_promotion(candidate_auc, None, margin, baseline=baseline)
    prod_manifest, files = registry.read_files(production_version)
    comparable = prod_manifest.features == candidate.features
    production_auc = None
    if comparable:
        production_auc = evaluate(load_model(files, prod_manifest.files), data, "test")["auc"]
    return decide_promotion(
        candidate_auc,
        production_auc,
        margin,
        production_version=production_version,
        comparable=comparable,
        baseline=baseline,
    )
