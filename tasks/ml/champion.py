"""A champion per run: every contender judged on the same out-of-time backtest (calibrated), the
lowest log loss wins, a higher AUC breaks a tie, then the smaller model, then the family's name —
so the same figures always crown the same contender. When the backtest was skipped (too little
history) every contender is judged on the same test split instead, and the basis says so.

Pure records and arithmetic (no torch): the summary, the card and the CLI read them too.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from tasks.ml.evaluation import ModelEvaluation

TIE_DECIMALS = 6  # log losses and AUCs equal to this many decimals are a tie
Basis = Literal["backtest", "test split"]


class LeaderboardRow(BaseModel):
    """One contender of a run, as the leaderboard shows it."""

    family: str
    version: str
    size: int = Field(description="learned parameters")
    description: str = ""
    basis: Basis = "backtest"
    auc: float
    logloss: float
    ece: float
    mean_score: float
    positive_rate: float
    test_auc: float
    test_logloss: float
    train_seconds: float = Field(description="the fit of the run's model (not the backtest's)")
    seconds: float = Field(description="fit, calibration and backtest")
    device: str = "cpu"
    pool: str = "embedded"
    champion: bool = False
    reused: bool = Field(default=False, description="an earlier run with these inputs fitted it")


def judged_figures(evaluation: ModelEvaluation, basis: Basis) -> dict[str, float]:
    """``auc, logloss, ece, mean_score, positive_rate`` of the calibrated model on ``basis``."""
    comparison = evaluation.backtest.result if basis == "backtest" else evaluation.test
    if comparison is None:
        raise ValueError("no backtest result to judge on")
    m = comparison.model
    return {
        "auc": m.auc,
        "logloss": m.logloss,
        "ece": m.ece,
        "mean_score": m.mean_score,
        "positive_rate": m.positive_rate,
    }


def judging_basis(evaluations: list[ModelEvaluation]) -> Basis:
    """The backtest when every contender has one, else the test split."""
    if evaluations and all(e.backtest.result is not None for e in evaluations):
        return "backtest"
    return "test split"


def ranking_key(row: LeaderboardRow) -> tuple[float, float, int, str]:
    """Lower is better: log loss, then AUC (higher wins), then size, then family name."""
    return (round(row.logloss, TIE_DECIMALS), -round(row.auc, TIE_DECIMALS), row.size, row.family)


def crown(rows: list[LeaderboardRow]) -> list[LeaderboardRow]:
    """The rows ranked best first, the first marked champion; ValueError for none."""
    if not rows:
        raise ValueError("no contender to choose a champion from")
    ranked = sorted(rows, key=ranking_key)
    return [r.model_copy(update={"champion": i == 0}) for i, r in enumerate(ranked)]


def champion_line(rows: list[LeaderboardRow]) -> str:
    """Why the champion won, in words (for logs, the summary and the card)."""
    champion = next(r for r in rows if r.champion)
    others = [r for r in rows if not r.champion]
    if not others:
        return f"{champion.family} was the only contender ({champion.basis} log loss {champion.logloss:.4f})"
    runner = others[0]
    c, r = ranking_key(champion), ranking_key(runner)
    how = "lowest log loss"
    if c[0] == r[0]:
        how = "tied on log loss, higher AUC" if c[1] != r[1] else "tied on log loss and AUC"
    return (
        f"{champion.family} won on {champion.basis} ({how}: {champion.logloss:.4f}, AUC "
        f"{champion.auc:.4f}; next {runner.family} {runner.logloss:.4f}, AUC {runner.auc:.4f})"
    )
