"""The promotion gate: a champion replaces production only when it beats the RFM baseline and
production on the measure the champion was chosen by — calibrated log loss on the same rows (the
out-of-time backtest's, or the test split's when the backtest was skipped), a higher AUC breaking
a tie. A champion whose recipe is the baseline's (the ``rfm`` family) meets the baseline rule by
definition — the baseline cannot beat itself — and faces every other rule."""

from __future__ import annotations

from pydantic import BaseModel, Field

FORCE_HINT = "force it with promote=always (model-refresh) or `hybridflow models promote`"
TIE_DECIMALS = 6  # log losses (and AUCs) equal to this many decimals are a tie, as in the ranking


class BaselineCheck(BaseModel):
    """The candidate's calibrated log loss against the baseline's on the same rows
    (``own_recipe``: the candidate is the baseline's recipe, fitted and calibrated as a family)."""

    basis: str
    model_logloss: float
    baseline_logloss: float
    note: str = ""
    own_recipe: bool = False

    @property
    def beaten(self) -> bool:
        """True when the candidate's log loss is lower than the baseline's."""
        return self.model_logloss < self.baseline_logloss

    @property
    def passed(self) -> bool:
        """The baseline rule is met: the candidate beats the baseline, or is its recipe."""
        return self.own_recipe or self.beaten

    def describe(self) -> str:
        """The comparison in words."""
        note = f" ({self.note})" if self.note else ""
        if self.own_recipe:
            return (
                "the candidate is the RFM baseline's own recipe (family rfm), so the baseline "
                f"rule does not apply: its calibrated {self.basis} log loss "
                f"{self.model_logloss:.4f}, the uncalibrated baseline's "
                f"{self.baseline_logloss:.4f}{note}"
            )
        verdict = "beats" if self.beaten else "does not beat"
        return (
            f"candidate {self.basis} log loss {self.model_logloss:.4f} {verdict} the RFM "
            f"baseline's {self.baseline_logloss:.4f}{note}"
        )


class GateFigures(BaseModel):
    """A model's calibrated figures on the rows the gate judges on."""

    logloss: float
    auc: float


class GateBasis(BaseModel):
    """What the gate measures on: ``basis`` (``backtest``: each recipe fitted at T-2H and judged
    on the run's examples at T-H; ``test split``: the fitted models on the newest origin's test
    split), and how many labelled rows that is."""

    basis: str = "backtest"
    rows: int = 0

    def measure(self) -> str:
        """The measure in words, for the reason."""
        where = (
            "the backtest (each fitted at T-2H, judged at T-H)"
            if self.basis == "backtest"
            else "the test split"
        )
        rows = f"the same {self.rows:,} customers" if self.rows else "the same customers"
        return f"calibrated log loss on {rows} in {where}, AUC breaking a tie"


class PromotionDecision(BaseModel):
    """Whether to promote, and why, in words a person can read in the run summary."""

    promote: bool
    reason: str
    basis: str = Field(default="backtest", description="backtest | test split")
    candidate_logloss: float
    candidate_auc: float
    production_logloss: float | None = None
    production_auc: float | None = None
    margin: float = Field(default=0.0, description="log loss the candidate must gain")
    baseline: BaselineCheck | None = None


def decide_promotion(
    candidate: GateFigures,
    production: GateFigures | None,
    margin: float,
    *,
    basis: GateBasis | None = None,
    production_version: str | None = None,
    comparable: bool = True,
    same_recipe: bool = False,
    baseline: BaselineCheck | None = None,
) -> PromotionDecision:
    """Never promote a candidate that does not beat ``baseline`` (unless it is the baseline's
    recipe: ``baseline.own_recipe``); otherwise promote when there is
    no production model, when production cannot be judged on the same rows (its features
    differ), when the candidate's log loss is lower than production's by more than ``margin``
    (equal to :data:`TIE_DECIMALS` decimals: a higher AUC wins), or when the figures are of the
    same recipe (``same_recipe``: production's family and spec, this run's fit is newer)."""
    decision = _against_production(
        candidate,
        production,
        margin,
        basis or GateBasis(),
        production_version,
        comparable,
        same_recipe,
    )
    if baseline is None:
        return decision
    if not baseline.passed:
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


def beats_production(candidate: GateFigures, production: GateFigures, margin: float) -> bool:
    """Lower log loss by more than ``margin``; on a log-loss tie (and ``margin`` 0), higher AUC."""
    gain = round(production.logloss - candidate.logloss, TIE_DECIMALS)
    if gain != 0:
        return gain > margin
    return margin == 0 and round(candidate.auc - production.auc, TIE_DECIMALS) > 0


def _against_production(
    candidate: GateFigures,
    production: GateFigures | None,
    margin: float,
    basis: GateBasis,
    production_version: str | None,
    comparable: bool,
    same_recipe: bool,
) -> PromotionDecision:
    common = {
        "basis": basis.basis,
        "candidate_logloss": candidate.logloss,
        "candidate_auc": candidate.auc,
        "margin": margin,
    }
    if production_version is None:
        return PromotionDecision(
            promote=True, reason="first model: no production model yet", **common
        )
    if not comparable or production is None:
        return PromotionDecision(
            promote=True,
            reason=f"production {production_version} uses other features and cannot be compared",
            **common,
        )
    common |= {"production_logloss": production.logloss, "production_auc": production.auc}
    figures = (
        f"candidate {candidate.logloss:.4f} (AUC {candidate.auc:.4f}), production "
        f"{production_version} {production.logloss:.4f} (AUC {production.auc:.4f})"
    )
    if same_recipe:
        return PromotionDecision(
            promote=True,
            reason=(
                f"the candidate is production {production_version}'s recipe (family and spec) "
                f"fitted on newer data; {basis.measure()}: {figures}, one recipe"
            ),
            **common,
        )
    better = beats_production(candidate, production, margin)
    verdict = "beats" if better else "does not beat"
    gain = production.logloss - candidate.logloss
    reason = (
        f"candidate {verdict} production {production_version} on {basis.measure()}: {figures}; "
        f"gain {gain:+.4f}, required more than {margin:.4f}"
    )
    return PromotionDecision(promote=better, reason=reason, **common)
