"""The promotion gate: a candidate replaces production only when it is measurably better."""

from __future__ import annotations

from pydantic import BaseModel


class PromotionDecision(BaseModel):
    """Whether to promote, and why, in words a person can read in the run summary."""

    promote: bool
    reason: str
    candidate_auc: float
    production_auc: float | None = None
    margin: float = 0.0


def decide_promotion(
    candidate_auc: float,
    production_auc: float | None,
    margin: float,
    *,
    production_version: str | None = None,
    comparable: bool = True,
) -> PromotionDecision:
    """Promote when there is no production model, when production cannot be evaluated on the
    same data (its features differ), or when the candidate's test AUC beats it by ``margin``."""
    if production_version is None:
        return PromotionDecision(
            promote=True,
            reason="first model: no production model yet",
            candidate_auc=candidate_auc,
            margin=margin,
        )
    if not comparable or production_auc is None:
        return PromotionDecision(
            promote=True,
            reason=f"production {production_version} uses other features and cannot be compared",
            candidate_auc=candidate_auc,
            margin=margin,
        )
    gain = candidate_auc - production_auc
    better = gain > margin
    verdict = "beats" if better else "does not beat"
    reason = (
        f"candidate AUC {candidate_auc:.4f} {verdict} production {production_version} "
        f"AUC {production_auc:.4f} by more than {margin:.4f} (gain {gain:+.4f}) on the same test set"
    )
    return PromotionDecision(
        promote=better,
        reason=reason,
        candidate_auc=candidate_auc,
        production_auc=production_auc,
        margin=margin,
    )
