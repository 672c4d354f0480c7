"""The train stage: snapshot in the store -> trained, evaluated, registered model -> gate."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable

from infra.datasets import local_dataset_dir, read_dataset_manifest, release_local_dir
from infra.devices import select_device
from infra.registry import ModelRegistry, PromotionConflict
from infra.settings import HybridflowSettings
from infra.store import ObjectStore
from tasks.model import bundle_bytes, load_bundle
from tasks.preprocess import Normalizer
from tasks.promotion import PromotionDecision, decide_promotion
from tasks.stage_records import PreprocessResult, StageReport, TrainResult
from tasks.train import (
    EpochRecord,
    SplitArrays,
    build_model,
    evaluate,
    load_split,
    train_model,
)

log = logging.getLogger(__name__)
CODE_VERSION = "hybridflow-0.1.0"


def train_stage(
    store: ObjectStore,
    prepared: PreprocessResult,
    settings: HybridflowSettings,
    *,
    as_of: dt.date,
    horizon_days: int,
    device_preference: str = "auto",
    on_epoch: Callable[[EpochRecord], None] | None = None,
) -> tuple[TrainResult, PromotionDecision]:
    """Train on the snapshot, evaluate on its test split, register, and apply the gate."""
    started = time.perf_counter()
    device = select_device(device_preference)
    snapshot = read_dataset_manifest(store, prepared.snapshot_prefix)
    normalizer = Normalizer.model_validate(snapshot.metadata["normalizer"])
    local = local_dataset_dir(store, snapshot)
    try:
        train = load_split(local, "train", normalizer.features)
        val = load_split(local, "val", normalizer.features)
        test = load_split(local, "test", normalizer.features)
    finally:
        release_local_dir(store, local)
    model = build_model(normalizer, settings.train)
    outcome = train_model(model, train, val, settings.train, device)
    if on_epoch:
        for record in outcome.history:
            on_epoch(record)
    model = outcome.model.cpu()
    metrics = evaluate(model, test)
    log.info(
        "test AUC %.4f, PR AUC %.4f, log loss %.4f",
        metrics["auc"],
        metrics["pr_auc"],
        metrics["logloss"],
    )

    registry = ModelRegistry(store)
    production = registry.alias()
    manifest = registry.register(
        bundle_bytes(model),
        metrics={f"test_{k}": v for k, v in metrics.items()}
        | {"n_train": float(len(train.y)), "n_test": float(len(test.y))},
        features=normalizer.features,
        data_fingerprint=prepared.data_fingerprint,
        parent_version=production.version if production else None,
        code_version=CODE_VERSION,
        as_of=as_of,
        horizon_days=horizon_days,
        training={
            "epochs": len(outcome.history),
            "best_epoch": outcome.best_epoch,
            "steps": outcome.steps,
            "device": device.type,
            "settings": settings.train.model_dump(),
        },
    )
    decision = _gate(
        registry,
        production.version if production else None,
        metrics["auc"],
        normalizer.features,
        test,
        settings.promotion_margin,
    )
    promoted = False
    if decision.promote:
        try:
            registry.set_alias(
                manifest.version,
                decision.reason,
                expected_version=production.version if production else None,
            )
            promoted = True
        except PromotionConflict as exc:
            decision = decision.model_copy(update={"promote": False, "reason": str(exc)})
    log.info("model %s: %s", manifest.version, decision.reason)
    result = TrainResult(
        report=StageReport(
            name="train",
            seconds=time.perf_counter() - started,
            device=device.type,
            rows_in=len(train.y) + len(val.y) + len(test.y),
        ),
        model_version=manifest.version,
        promoted=promoted,
        decision_reason=decision.reason,
        production_version=production.version if production else None,
        metrics=metrics,
        n_train=len(train.y),
        n_test=len(test.y),
        epochs=len(outcome.history),
        best_epoch=outcome.best_epoch,
    )
    return result, decision


def _gate(
    registry: ModelRegistry,
    production_version: str | None,
    candidate_auc: float,
    candidate_features: list[str],
    test: SplitArrays,
    margin: float,
) -> PromotionDecision:
    """Evaluate production on the candidate's test split (when features match) and decide."""
    if production_version is None:
        return decide_promotion(candidate_auc, None, margin)
    prod_manifest, files = registry.read_files(production_version)
    comparable = prod_manifest.features == candidate_features
    production_auc = None
    if comparable:
        production_auc = evaluate(load_bundle(files, prod_manifest.files), test)["auc"]
    return decide_promotion(
        candidate_auc,
        production_auc,
        margin,
        production_version=production_version,
        comparable=comparable,
    )
