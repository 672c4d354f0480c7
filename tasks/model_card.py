"""The model card: a markdown page about a trained version (shown as a Prefect artifact)."""

from __future__ import annotations

from tasks.promotion import PromotionDecision
from tasks.stage_records import FeaturesResult, TrainResult


def model_card_markdown(
    result: TrainResult, decision: PromotionDecision, features: FeaturesResult, versions_uri: str
) -> str:
    """Metrics, data window, features, lineage and the gate's decision, as markdown."""
    m = result.metrics
    lines = [
        f"# Model {result.model_version}",
        "",
        f"**Promoted:** {'yes' if result.promoted else 'no'} — {decision.reason}",
        "",
        "| metric | value |",
        "|---|---|",
        f"| test ROC AUC | {m['auc']:.4f} |",
        f"| test PR AUC | {m['pr_auc']:.4f} |",
        f"| test log loss | {m['logloss']:.4f} |",
        f"| test positive rate | {m['positive_rate']:.4f} |",
        f"| train / test rows | {result.n_train} / {result.n_test} |",
        f"| epochs (best) | {result.epochs} ({result.best_epoch}) |",
        "",
        f"**Data window:** features at as_of − {features.horizon_days} days, labels in "
        f"(as_of − {features.horizon_days} days, {features.as_of}]",
        "",
        f"**Parent (production before):** {result.production_version or 'none'}",
        "",
        f"**Version URI:** {versions_uri}/{result.model_version}/",
        "",
        f"**Features ({len(features.features)}):** " + ", ".join(features.features),
    ]
    return "\n".join(lines)
