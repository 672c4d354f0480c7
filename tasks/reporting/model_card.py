"""The model card: a markdown page about a trained version (shown as a Prefect artifact).

It puts the calibrated model, the raw model and the baseline side by side — out of time (the
backtest) first, then on the test split — with the reliability table and two embedded charts.
"""

from __future__ import annotations

from infra.storage.registry import ModelManifest
from tasks.ml.baseline import BASELINE_NAME
from tasks.ml.evaluation import BacktestReport, ModelComparison, ModelEvaluation
from tasks.ml.metrics import QualityMetrics
from tasks.ml.promotion import PromotionDecision
from tasks.reporting.card_charts import leaderboard_svg, lift_svg, reliability_svg, svg_data_uri
from tasks.reporting.records import FeaturesResult, TrainResult

COMPARED = ("model", "model (raw)", "baseline")


def _auc(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _pair(logloss: float | None, auc: float | None) -> str:
    return "-" if logloss is None else f"{logloss:.4f} ({_auc(auc)})"


def model_card_markdown(
    result: TrainResult,
    decision: PromotionDecision,
    features: FeaturesResult,
    manifest: ModelManifest,
    versions_uri: str,
) -> str:
    """Metrics, data, lineage, training run and the gate's decision, as markdown."""
    m = result.metrics
    training = manifest.training
    start = f"warm start from {manifest.parent_version}" if manifest.warm_start else "from scratch"
    resumed = result.resumed_from_step
    lines = [
        f"# Model {result.model_version}",
        "",
        f"**Promoted:** {'yes' if result.promoted else 'no'} — {decision.reason}",
        "",
        "## Promotion gate",
        "",
        "| | value |",
        "|---|---|",
        f"| measure | calibrated log loss on the same rows ({decision.basis}), AUC breaks a tie |",
        f"| candidate log loss (AUC) | {_pair(decision.candidate_logloss, decision.candidate_auc)} |",
        f"| production log loss (AUC) | {_pair(decision.production_logloss, decision.production_auc)} |",
        f"| production before | {result.production_version or 'none'} |",
        f"| required log loss gain | {decision.margin:.4f} |",
        f"| against the baseline | {decision.baseline.describe() if decision.baseline else '-'} |",
        "",
        *leaderboard_section(result),
        *quality_sections(result.evaluation, result.n_train, result.n_test, m),
        "",
        "## Training",
        "",
        f"- start: {start}",
        f"- training id: `{result.training_id}`"
        + (f" (resumed from checkpoint step {resumed})" if resumed is not None else ""),
        f"- epochs (best): {result.epochs} ({result.best_epoch}); optimiser steps: {result.steps}",
        f"- device: {training.get('device', '-')}; processes: {training.get('world_size', 1)}; "
        f"learning rate: {training.get('learning_rate', '-')}",
        f"- checkpoints: {result.checkpoints_uri or '-'}",
        "",
        "## Data and lineage",
        "",
        f"- window: features at as_of − {features.horizon_days} days, labels in "
        f"(as_of − {features.horizon_days} days, {features.as_of}]",
        f"- data fingerprint: `{manifest.data_fingerprint}`",
        f"- parent version: {manifest.parent_version or 'none'}",
        f"- code version: {manifest.code_version}",
        f"- created: {manifest.created_at.isoformat()}",
        f"- version URI: {versions_uri}/{result.model_version}/",
        "- files: " + ", ".join(f"`{n}` sha256 `{h}`" for n, h in sorted(manifest.files.items())),
        "",
        f"**Features ({len(manifest.features)}):** " + ", ".join(manifest.features),
    ]
    return "\n".join(lines)


def leaderboard_section(result: TrainResult) -> list[str]:
    """Every contender of the run, best first, and a chart of their log losses."""
    board = result.leaderboard
    if not board:
        return []
    basis = board[0].basis
    lines = [
        "## Contenders",
        "",
        f"Each family fitted on the same snapshot and judged on the same {basis} "
        f"(calibrated); lowest log loss wins, AUC breaks ties. {result.champion_reason}.",
        "",
        "| | family | size | AUC | log loss | ECE | mean score / rate | fit seconds | device "
        "| pool | version |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in board:
        lines.append(
            f"| {'champion' if r.champion else ''} | {r.family} | {r.size:,} | {r.auc:.4f} "
            f"| {r.logloss:.4f} | {r.ece:.4f} | {r.mean_score:.3f} / {r.positive_rate:.3f} "
            f"| {r.train_seconds:.1f} | {r.device} | {r.pool} | `{r.version}`"
            + (" (reused)" if r.reused else "")
            + " |"
        )
    floor = None
    evaluation = result.evaluation
    if evaluation is not None:
        shown = evaluation.backtest.result if basis == "backtest" else evaluation.test
        floor = shown.baseline.logloss if shown is not None else None
    chart = leaderboard_svg({r.family: r.logloss for r in board}, floor, f"Contenders ({basis})")
    return [*lines, "", f"![contenders ({basis})]({svg_data_uri(chart)})", ""]


def quality_sections(
    evaluation: ModelEvaluation | None, n_train: int, n_test: int, metrics: dict[str, float]
) -> list[str]:
    """Backtest, test split, calibration and charts, as markdown lines."""
    if evaluation is None:
        return [
            "## Test metrics",
            "",
            f"ROC AUC {metrics['auc']:.4f}, PR AUC {metrics['pr_auc']:.4f}, "
            f"log loss {metrics['logloss']:.4f} (no calibration or baseline was recorded)",
        ]
    backtest = evaluation.backtest
    lines = ["## Out-of-time backtest", "", *_backtest_lines(backtest), ""]
    lines += [
        "## Test split (customers held out of the training window)",
        "",
        f"{n_train} train examples / {n_test} test customers at as_of − horizon; calibration "
        "fitted on the val split.",
        "",
        *comparison_table(evaluation.test),
        "",
        "## Calibration",
        "",
        f"- in the bundle: {evaluation.calibration.describe()}",
        "- every method fitted on the same held-out rows, judged "
        + ("out of time:" if backtest.result else "on the test split:"),
        "",
        *_methods_table(backtest.result or evaluation.test),
    ]
    shown = backtest.result or evaluation.test
    where = "backtest" if backtest.result else "test split"
    lines += ["", f"## Reliability and lift ({where})", "", *reliability_lines(shown.model)]
    lines += ["", *chart_lines(shown, where)]
    return lines


def _backtest_lines(backtest: BacktestReport) -> list[str]:
    w = backtest.windows
    if backtest.result is None:
        return [f"**Skipped:** {backtest.reason}"]
    earlier = (
        f" and {len(backtest.origins) - 1} earlier origin(s) down to {backtest.origins[-1]}"
        if len(backtest.origins) > 1
        else ""
    )
    return [
        f"Trained the same way at {w.train_features_until}{earlier} (labels in "
        f"({w.train_features_until}, {w.train_labels_until}] and the horizon after each origin, "
        f"{backtest.n_train} train examples) and judged on the {backtest.n_judged} customers at {w.train_labels_until} "
        f"by what they did in ({w.train_labels_until}, {w.judged_labels_until}]. "
        f"Baseline: {BASELINE_NAME}, fitted on the same rows.",
        "",
        *comparison_table(backtest.result),
    ]


def comparison_table(comparison: ModelComparison) -> list[str]:
    """One row per figure, one column per model (calibrated, raw, baseline)."""
    cols = (comparison.model, comparison.model_uncalibrated, comparison.baseline)
    rows = [
        ("ROC AUC", "auc"),
        ("PR AUC", "pr_auc"),
        ("log loss", "logloss"),
        ("Brier score", "brier"),
        ("expected calibration error", "ece"),
        ("mean score", "mean_score"),
        ("top-decile lift", "top_decile_lift"),
    ]
    out = ["| | " + " | ".join(COMPARED) + " |", "|---|---|---|---|"]
    out += [
        f"| {label} | " + " | ".join(f"{getattr(c, key):.4f}" for c in cols) + " |"
        for label, key in rows
    ]
    out.append(f"| observed positive rate | {comparison.model.positive_rate:.4f} | | |")
    return out


def _methods_table(comparison: ModelComparison) -> list[str]:
    out = ["| method | log loss | Brier | ECE | mean score |", "|---|---|---|---|---|"]
    for method, score in comparison.calibration_methods.items():
        out.append(
            f"| {method} | {score.logloss:.4f} | {score.brier:.4f} | {score.ece:.4f} "
            f"| {score.mean_score:.4f} |"
        )
    return out


def reliability_lines(metrics: QualityMetrics) -> list[str]:
    """The calibrated model's 10-bin reliability table."""
    out = ["| score bin | customers | mean score | observed rate |", "|---|---|---|---|"]
    for b in metrics.reliability:
        mean = "-" if b.mean_score is None else f"{b.mean_score:.4f}"
        rate = "-" if b.observed_rate is None else f"{b.observed_rate:.4f}"
        out.append(f"| [{b.lower:.1f}, {b.upper:.1f}) | {b.n} | {mean} | {rate} |")
    return out


def chart_lines(comparison: ModelComparison, where: str) -> list[str]:
    """The reliability plot and the lift chart as inline SVG images."""
    models = dict(
        zip(
            COMPARED,
            (comparison.model, comparison.model_uncalibrated, comparison.baseline),
            strict=True,
        )
    )
    reliability = reliability_svg(
        {k: v.reliability for k, v in models.items()}, f"Reliability ({where})"
    )
    lift = lift_svg(
        {k: models[k].lift for k in ("model", "baseline")}, f"Lift by score decile ({where})"
    )
    return [
        f"![reliability plot ({where})]({svg_data_uri(reliability)})",
        "",
        f"![lift chart ({where})]({svg_data_uri(lift)})",
    ]
