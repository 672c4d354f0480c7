"""The promotion gate: a candidate replaces production only when it beats the baseline on
calibrated log loss (out of time when the backtest ran) and production on test AUC."""

from __future__ import annotations

from pydantic import BaseModel

FORCE_HINT = "force it with promote=always (model-refresh) or `hybridflow models promote`"


class BaselineCheck(BaseModel):
    """The candidate's calibrated log loss against the baseline's on the same rows."""

    basis: str
    model_logloss: float
    baseline_logloss: float
    note: str = ""

    @property
    def beaten(self) -> bool:
        """True when the candidate's log loss is lower than the baseline's."""
        return self.model_logloss < self.baseline_logloss

    def describe(self) -> str:
        """The comparison in words."""
        verdict = "beats" if self.beaten else "does not beat"
        note = f" ({self.note})" if self.note else ""
        return (
            f"candidate {self.basis} log loss {self.model_logloss:.4f} {verdict} the RFM "
            f"baseline's {self.baseline_logloss:.4f}{note}"
        )


class PromotionDecision(BaseModel):
    """Whether to promote, and why, in words a person can read in the run summary."""

    promote: bool
    reason: str
    candidate_auc: float
    production_auc: float | None = None
    margin: float = 0.0
    baseline: BaselineCheck | None = None


def decide_promotion(
    candidate_auc: float,
    production_auc: float | None,
    margin: float,
    *,
    production_version: str | None = None,
    comparable: bool = True,
    baseline: BaselineCheck | None = None,
) -> PromotionDecision:
    """Never promote a candidate that does not beat ``baseline``; otherwise promote when there is
    no production model, when production cannot be evaluated on the same data (its features
    differ), or when the candidate's test AUC beats it by ``margin``."""
    decision = _against_production(
        candidate_auc, production_auc, margin, production_version, comparable
    )
    if baseline is None:
        return decision
    if not baseline.beaten:
        return decision.model_copy(
            update={
                "promote": False,
                "reason": f"{baseline.describe()}: not promoted ({FORCE_HINT})",
                "baseline": baseline,
            }
        )
    return decision.model_copy(
        update={"reason": f"{decision.reason}; {baseline.describe()}", "baseline": baseline}
    )


def _against_production(
    candidate_auc: float,
    production_auc: float | None,
    margin: float,
    production_version: str | None,
    comparable: bool,
) -> PromotionDecision:
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
