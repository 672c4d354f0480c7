"""The train stage: snapshot in the store -> trained (resumably), evaluated, registered model ->
promotion gate. Runs as one process or as every rank of a torchrun DDP job."""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from pydantic import BaseModel

from infra.datasets import local_dataset_dir, read_dataset_manifest, release_local_dir
from infra.devices import configure_accelerator, configure_cpu_threads
from infra.registry import ModelManifest, ModelRegistry, PromotionConflict
from infra.settings import HybridflowSettings
from infra.store import ObjectStore
from tasks.checkpoints import CheckpointPolicy, CheckpointStore
from tasks.ddp import init_distributed
from tasks.model import bundle_bytes, load_bundle
from tasks.preprocess import Normalizer
from tasks.promotion import PromotionDecision, decide_promotion
from tasks.snapshot_stream import SnapshotStream
from tasks.stage_records import PreprocessResult, StageReport, TrainResult
from tasks.train import EpochRecord, Progress, evaluate, model_from_state, train_model
from tasks.training_plan import CODE_VERSION, choose_start, training_id

log = logging.getLogger(__name__)
SMALL_MODEL_PARAMS = 200_000


class TrainingOptions(BaseModel):
    """Per-run switches of the train stage."""

    fresh: bool = False
    scratch: bool = False
    stop_after_steps: int | None = None


class TrainingInterrupted(RuntimeError):
    """Training stopped early on purpose (``stop_after_steps``) with a checkpoint to resume from."""


@dataclass
class StageOutput:
    """What rank 0 reports: the result, the gate's decision and the epoch history."""

    result: TrainResult
    decision: PromotionDecision
    history: list[EpochRecord]


def train_stage(
    store: ObjectStore,
    prepared: PreprocessResult,
    settings: HybridflowSettings,
    *,
    as_of: dt.date,
    horizon_days: int,
    device_preference: str = "auto",
    options: TrainingOptions | None = None,
    on_epoch: Callable[[EpochRecord], None] | None = None,
) -> StageOutput | None:
    """Train (resuming this training id's newest valid checkpoint), evaluate on the test split,
    register, and apply the gate. Returns None on ranks other than 0."""
    options = options or TrainingOptions()
    started = time.perf_counter()
    ctx, device = init_distributed(device_preference)
    configure_accelerator(device)
    snapshot = read_dataset_manifest(store, prepared.snapshot_prefix)
    normalizer = Normalizer.model_validate(snapshot.metadata["normalizer"])
    local = local_dataset_dir(store, snapshot)
    try:
        data = SnapshotStream(
            local,
            normalizer.features,
            chunk_rows=settings.train.stream_chunk_rows,
            cache_bytes=settings.train.stream_cache_mb << 20,
        )
        fingerprint = data.fingerprint()
        registry = ModelRegistry(store)
        production = registry.alias()
        start = choose_start(registry, production, normalizer, settings.train, options.scratch)
        tid = training_id(fingerprint, settings.train, start)
        if device.type == "cpu":
            _configure_threads(settings, start.model, ctx.world_size)
        checkpoints = CheckpointStore(store, tid, keep=settings.checkpoint.keep)
        log.info("training %s: %s; checkpoints at %s", tid, start.reason, checkpoints.uri())
        if options.fresh and ctx.is_main:
            removed = checkpoints.clear()
            log.info("--fresh: training %s starts over (%d checkpoints removed)", tid, removed)
        ctx.barrier()
        done = None if options.fresh else registry.find_training(tid)
        if done is not None:
            log.info(
                "training %s finished before as version %s: reusing it (--fresh retrains)",
                tid,
                done.version,
            )
            if not ctx.is_main:
                return None
            return _report_existing(registry, done, data, settings, started, device.type)

        loaded = checkpoints.latest_valid()
        ctx.barrier()  # every rank has chosen its checkpoint before rank 0 may write a newer one
        model, resume = start.model, None
        if loaded is not None:
            m = loaded.manifest
            model, resume = model_from_state(loaded.state), loaded.state
            log.info(
                "training %s resumed from checkpoint step %d (epoch %d, batch %d) at %s",
                tid,
                m.step,
                m.epoch,
                m.batch,
                loaded.uri,
            )
        else:
            log.info("training %s starts at step 0", tid)

        def save(state: dict, progress: Progress) -> None:
            manifest = checkpoints.save(
                state,
                step=progress.step,
                epoch=progress.epoch,
                batch=progress.batch,
                samples_seen=progress.samples,
                best_metric=progress.best_logloss if math.isfinite(progress.best_logloss) else None,
                finished=progress.finished,
                world_size=ctx.world_size,
            )
            log.info("checkpoint step %d saved (%d bytes)", manifest.step, manifest.size_bytes)

        compile_model = (
            settings.train.compile if settings.train.compile is not None else device.type == "cuda"
        )
        outcome = train_model(
            model,
            data,
            settings.train,
            device,
            learning_rate=start.learning_rate,
            ctx=ctx,
            resume=resume,
            save=save,
            policy=CheckpointPolicy(
                settings.checkpoint.every_steps, settings.checkpoint.every_seconds
            ),
            stop_after_steps=options.stop_after_steps,
            compile_model=compile_model,
        )
        if outcome.interrupted:
            raise TrainingInterrupted(
                f"training {tid} stopped after {outcome.steps_this_run} steps at step "
                f"{outcome.progress.step}; run again to resume from its checkpoint"
            )
        if not ctx.is_main:
            return None
        if on_epoch:
            for record in outcome.history:
                on_epoch(record)
        model = outcome.model.cpu()
        metrics = evaluate(model, data, "test")
        log.info(
            "test AUC %.4f, PR AUC %.4f, log loss %.4f",
            metrics["auc"],
            metrics["pr_auc"],
            metrics["logloss"],
        )
        manifest = registry.register(
            bundle_bytes(model),
            metrics={f"test_{k}": v for k, v in metrics.items()}
            | {"n_train": float(data.rows("train")), "n_test": float(data.rows("test"))},
            features=normalizer.features,
            data_fingerprint=fingerprint,
            parent_version=start.parent_version,
            warm_start=start.warm_start,
            training_id=tid,
            code_version=CODE_VERSION,
            as_of=as_of,
            horizon_days=horizon_days,
            training={
                "epochs": len(outcome.history),
                "best_epoch": outcome.best_epoch,
                "steps": outcome.progress.step,
                "samples_seen": outcome.progress.samples,
                "resumed_from_step": outcome.resumed_from_step,
                "world_size": ctx.world_size,
                "device": device.type,
                "learning_rate": start.learning_rate,
                "start": start.reason,
                "production_before": production.version if production else None,
                "settings": settings.train.model_dump(),
            },
        )
        return _promote(
            registry, manifest, data, settings, started, device.type, outcome.history, checkpoints
        )
    finally:
        release_local_dir(store, local)


def _promote(
    registry: ModelRegistry,
    manifest: ModelManifest,
    data: SnapshotStream,
    settings: HybridflowSettings,
    started: float,
    device: str,
    history: list[EpochRecord],
    checkpoints: CheckpointStore | None,
) -> StageOutput:
    """Apply the gate against the current production and move the alias (compare-and-swap)."""
    production = registry.alias()
    production_version = production.version if production else None
    candidate_auc = manifest.metrics["test_auc"]
    if production_version == manifest.version:
        decision = PromotionDecision(
            promote=False,
            reason=f"{manifest.version} is production already",
            candidate_auc=candidate_auc,
            margin=settings.promotion_margin,
        )
    else:
        decision = _gate(registry, production_version, manifest, data, settings.promotion_margin)
    promoted = False
    if decision.promote:
        try:
            registry.set_alias(
                manifest.version, decision.reason, expected_version=production_version
            )
            promoted = True
        except PromotionConflict as exc:
            decision = decision.model_copy(update={"promote": False, "reason": str(exc)})
    log.info("model %s: %s", manifest.version, decision.reason)
    metrics = {
        k.removeprefix("test_"): v for k, v in manifest.metrics.items() if k.startswith("test_")
    }
    training = manifest.training
    result = TrainResult(
        report=StageReport(
            name="train",
            seconds=time.perf_counter() - started,
            device=device,
            rows_in=sum(data.rows(s) for s in data.splits),
        ),
        model_version=manifest.version,
        promoted=promoted,
        decision_reason=decision.reason,
        production_version=production_version,
        metrics=metrics,
        n_train=data.rows("train"),
        n_test=data.rows("test"),
        epochs=int(training.get("epochs", 0)),
        best_epoch=int(training.get("best_epoch", 0)),
        training_id=manifest.training_id,
        warm_start=manifest.warm_start,
        parent_version=manifest.parent_version,
        resumed_from_step=training.get("resumed_from_step"),
        steps=int(training.get("steps", 0)),
        checkpoints_uri=checkpoints.uri() if checkpoints else "",
    )
    return StageOutput(result=result, decision=decision, history=history)


def _report_existing(
    registry: ModelRegistry,
    manifest: ModelManifest,
    data: SnapshotStream,
    settings: HybridflowSettings,
    started: float,
    device: str,
) -> StageOutput:
    """A finished training's version, gated again (the earlier run may have died before)."""
    return _promote(registry, manifest, data, settings, started, device, [], None)


def _gate(
    registry: ModelRegistry,
    production_version: str | None,
    candidate: ModelManifest,
    data: SnapshotStream,
    margin: float,
) -> PromotionDecision:
    """Evaluate production on the candidate's test split (when features match) and decide."""
    candidate_auc = candidate.metrics["test_auc"]
    if production_version is None:
        return decide_promotion(candidate_auc, None, margin)
    prod_manifest, files = registry.read_files(production_version)
    comparable = prod_manifest.features == candidate.features
    production_auc = None
    if comparable:
        production_auc = evaluate(load_bundle(files, prod_manifest.files), data, "test")["auc"]
    return decide_promotion(
        candidate_auc,
        production_auc,
        margin,
        production_version=production_version,
        comparable=comparable,
    )


def _configure_threads(
    settings: HybridflowSettings, model: torch.nn.Module, processes: int
) -> None:
    """Torch threads on CPU: the setting, else one for small models (intra-op parallelism only
    adds overhead there), else the available cores shared among the local processes."""
    n_params = sum(p.numel() for p in model.parameters())
    small = n_params < SMALL_MODEL_PARAMS
    threads = configure_cpu_threads(settings.train.threads or (1 if small else None), processes)
    log.info("CPU training: %d torch threads per process (%d parameters)", threads, n_params)
