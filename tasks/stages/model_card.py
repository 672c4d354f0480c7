"""The model card: a markdown page about a trained version (shown as a Prefect artifact)."""

from __future__ import annotations

from infra.registry import ModelManifest
from tasks.ml.promotion import PromotionDecision
from tasks.stages.records import FeaturesResult, TrainResult


def _auc(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


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
        f"| candidate test AUC | {_auc(decision.candidate_auc)} |",
        f"| production test AUC (same test set) | {_auc(decision.production_auc)} |",
        f"| production before | {result.production_version or 'none'} |",
        f"| required margin | {decision.margin:.4f} |",
        "",
        "## Test metrics",
        "",
        "| metric | value |",
        "|---|---|",
        f"| ROC AUC | {m['auc']:.4f} |",
        f"| PR AUC | {m['pr_auc']:.4f} |",
        f"| log loss | {m['logloss']:.4f} |",
        f"| positive rate | {m['positive_rate']:.4f} |",
        f"| train / test rows | {result.n_train} / {result.n_test} |",
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
