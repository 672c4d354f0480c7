"""The train stage: snapshot in the store -> trained (resumably), evaluated, registered model ->
promotion gate. Runs as one process or as every rank of a torchrun DDP job.

:func:`launch_training` is the one entry point: the ``train`` flow calls it, and it either trains
here or starts ``torchrun -m tasks.stages.train_process``, whose ranks call
:func:`train_for_run` and whose rank 0 hands back the same typed :class:`TrainStageOutput`.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import BaseModel

from infra.datasets import local_dataset_dir, read_dataset_manifest, release_local_dir
from infra.devices import configure_accelerator, configure_cpu_threads
from infra.registry import AliasRecord, ModelManifest, ModelRegistry
from infra.settings import HybridflowSettings
from infra.store import ObjectStore
from infra.warm_imports import finish_warm_imports
from tasks.ml.checkpoints import CheckpointPolicy, CheckpointStore
from tasks.ml.ddp import DistContext, init_distributed, launch_ddp_training
from tasks.ml.evaluation import ModelEvaluation
from tasks.ml.model import CustomerMLP, Normalizer, bundle_bytes
from tasks.ml.promotion import PromotionDecision
from tasks.ml.snapshot_reader import SnapshotStream
from tasks.ml.training_loop import (
    EpochRecord,
    Progress,
    TrainOutcome,
    model_from_state,
    train_model,
)
from tasks.ml.warm_start import CODE_VERSION, StartPoint, choose_start, training_id
from tasks.stages.gate import gate_and_promote
from tasks.stages.quality import judge_candidate
from tasks.stages.records import (
    FeaturesResult,
    PreprocessResult,
    StageReport,
    TrainResult,
    read_stage_manifest,
)

log = logging.getLogger(__name__)
SMALL_MODEL_PARAMS = 200_000


class TrainingOptions(BaseModel):
    """Per-run switches of the train stage."""

    fresh: bool = False
    scratch: bool = False
    stop_after_steps: int | None = None


class TrainingInterrupted(RuntimeError):
    """Training stopped early on purpose (``stop_after_steps``) with a checkpoint to resume from."""


class TrainStageOutput(BaseModel):
    """What rank 0 reports: the result, the gate's decision and the epoch history."""

    result: TrainResult
    decision: PromotionDecision
    history: list[EpochRecord]


@dataclass
class _TrainingPlan:
    """Everything decided before the first step: where to start and where to checkpoint."""

    production: AliasRecord | None
    start: StartPoint
    data_fingerprint: str
    training_id: str
    checkpoints: CheckpointStore


def launch_training(
    store: ObjectStore,
    run_id: str,
    settings: HybridflowSettings,
    *,
    device_preference: str = "auto",
    options: TrainingOptions | None = None,
) -> TrainStageOutput:
    """Train on the run's snapshot in this process, or under torchrun on
    ``HYBRIDFLOW_TRAIN__DDP_PROCESSES`` devices (rank 0 writes its output as JSON)."""
    options = options or TrainingOptions()
    if settings.train.ddp_processes <= 1:
        output = train_for_run(
            store, run_id, settings, device_preference=device_preference, options=options
        )
        assert output is not None  # a single process is rank 0
        return output
    args = ["--run-id", run_id, "--store", store.uri, "--device", device_preference]
    args += ["--fresh"] * options.fresh + ["--scratch"] * options.scratch
    with tempfile.TemporaryDirectory(prefix="hf-ddp-") as tmp:
        result_file = Path(tmp) / "result.json"
        launch_ddp_training(settings.train.ddp_processes, args, result_file)
        return TrainStageOutput.model_validate_json(result_file.read_text())


def train_for_run(
    store: ObjectStore,
    run_id: str,
    settings: HybridflowSettings,
    *,
    device_preference: str = "auto",
    options: TrainingOptions | None = None,
) -> TrainStageOutput | None:
    """The train stage of pipeline run ``run_id`` (its features and preprocess manifests)."""
    features = read_stage_manifest(store, run_id, "features", FeaturesResult)
    prepared = read_stage_manifest(store, run_id, "preprocess", PreprocessResult)
    return train_stage(
        store,
        prepared,
        settings,
        as_of=features.as_of,
        horizon_days=features.horizon_days,
        device_preference=device_preference,
        options=options,
    )


def train_stage(
    store: ObjectStore,
    prepared: PreprocessResult,
    settings: HybridflowSettings,
    *,
    as_of: dt.date,
    horizon_days: int,
    device_preference: str = "auto",
    options: TrainingOptions | None = None,
) -> TrainStageOutput | None:
    """Train (resuming this training id's newest valid checkpoint), evaluate on the test split,
    register, and apply the gate. Returns None on ranks other than 0."""
    options = options or TrainingOptions()
    started = time.perf_counter()
    finish_warm_imports()
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
        registry = ModelRegistry(store)
        plan = _plan_training(store, registry, data, normalizer, settings, options, ctx, device)
        done = None if options.fresh else registry.find_training(plan.training_id)
        if done is not None:
            log.info(
                "training %s finished before as version %s: reusing it (--fresh retrains)",
                plan.training_id,
                done.version,
            )
            if not ctx.is_main:
                return None
            return _gate_and_report(registry, done, data, settings, started, device.type)
        outcome = _fit(plan, data, settings, options, ctx, device)
        if not ctx.is_main:
            return None
        model, evaluation = judge_candidate(
            store, prepared, outcome.model, data, settings, device, as_of, horizon_days
        )
        manifest = _register(
            registry,
            model,
            evaluation,
            outcome,
            plan,
            data,
            settings,
            ctx,
            device,
            as_of,
            horizon_days,
        )
        return _gate_and_report(
            registry, manifest, data, settings, started, device.type, outcome.history, plan
        )
    finally:
        release_local_dir(store, local)


def _plan_training(
    store: ObjectStore,
    registry: ModelRegistry,
    data: SnapshotStream,
    normalizer: Normalizer,
    settings: HybridflowSettings,
    options: TrainingOptions,
    ctx: DistContext,
    device: torch.device,
) -> _TrainingPlan:
    """The starting point (warm start or scratch), the stable training id and its checkpoints
    (cleared first with ``fresh``)."""
    production = registry.alias()
    start = choose_start(registry, production, normalizer, settings.train, options.scratch)
    fingerprint = data.fingerprint()
    tid = training_id(fingerprint, settings.train, start)
    if device.type == "cpu":
        _configure_threads(settings, start.model, ctx.world_size)
    checkpoints = CheckpointStore(store, tid, keep=settings.checkpoint.keep)
    log.info("training %s: %s; checkpoints at %s", tid, start.reason, checkpoints.uri())
    if options.fresh and ctx.is_main:
        removed = checkpoints.clear()
        log.info("--fresh: training %s starts over (%d checkpoints removed)", tid, removed)
    ctx.barrier()
    return _TrainingPlan(production, start, fingerprint, tid, checkpoints)


def _fit(
    plan: _TrainingPlan,
    data: SnapshotStream,
    settings: HybridflowSettings,
    options: TrainingOptions,
    ctx: DistContext,
    device: torch.device,
) -> TrainOutcome:
    """Run the training loop from the newest valid checkpoint (or the start point), saving
    checkpoints in the background; TrainingInterrupted after ``stop_after_steps``."""
    checkpoints, tid = plan.checkpoints, plan.training_id
    model, resume = _resume_point(plan, ctx)

    def save(state: dict, progress: Progress) -> None:
        checkpoints.save_async(
            state,
            on_saved=lambda m: log.info(
                "checkpoint step %d saved (%d bytes)", m.step, m.size_bytes
            ),
            step=progress.step,
            epoch=progress.epoch,
            batch=progress.batch,
            samples_seen=progress.samples,
            best_metric=progress.best_logloss if math.isfinite(progress.best_logloss) else None,
            finished=progress.finished,
            world_size=ctx.world_size,
        )

    compile_model = (
        settings.train.compile if settings.train.compile is not None else device.type == "cuda"
    )
    try:
        outcome = train_model(
            model,
            data,
            settings.train,
            device,
            learning_rate=plan.start.learning_rate,
            ctx=ctx,
            resume=resume,
            save=save,
            policy=CheckpointPolicy(
                settings.checkpoint.every_steps, settings.checkpoint.every_seconds
            ),
            stop_after_steps=options.stop_after_steps,
            compile_model=compile_model,
        )
        checkpoints.wait()  # the last upload must have landed
    finally:
        checkpoints.close()
    if outcome.interrupted:
        raise TrainingInterrupted(
            f"training {tid} stopped after {outcome.steps_this_run} steps at step "
            f"{outcome.progress.step}; run again to resume from its checkpoint"
        )
    return outcome


def _resume_point(plan: _TrainingPlan, ctx: DistContext) -> tuple[CustomerMLP, dict | None]:
    """The model to train and the checkpoint state to continue from (None: step 0)."""
    loaded = plan.checkpoints.latest_valid()
    ctx.barrier()  # every rank has chosen its checkpoint before rank 0 may write a newer one
    if loaded is None:
        log.info("training %s starts at step 0", plan.training_id)
        return plan.start.model, None
    m = loaded.manifest
    log.info(
        "training %s resumed from checkpoint step %d (epoch %d, batch %d) at %s",
        plan.training_id,
        m.step,
        m.epoch,
        m.batch,
        loaded.uri,
    )
    return model_from_state(loaded.state), loaded.state


def _register(
    registry: ModelRegistry,
    model: CustomerMLP,
    evaluation: ModelEvaluation,
    outcome: TrainOutcome,
    plan: _TrainingPlan,
    data: SnapshotStream,
    settings: HybridflowSettings,
    ctx: DistContext,
    device: torch.device,
    as_of: dt.date,
    horizon_days: int,
) -> ModelManifest:
    """Register the best model, with its calibration and evaluation, as a new immutable version."""
    start, production = plan.start, plan.production
    return registry.register(
        bundle_bytes(model),
        metrics=evaluation.flat_metrics()
        | {
            "n_train": float(data.rows("train")),
            "n_test": float(data.newest_origin().rows("test")),
        },
        evaluation=evaluation.model_dump(mode="json"),
        features=model.config.features,
        data_fingerprint=plan.data_fingerprint,
        parent_version=start.parent_version,
        warm_start=start.warm_start,
        training_id=plan.training_id,
        code_version=CODE_VERSION,
        as_of=as_of,
        horizon_days=horizon_days,
        training={
            "epochs": len(outcome.history),
            "best_epoch": outcome.best_epoch,
            "steps": outcome.progress.step,
            "samples_seen": outcome.progress.samples,
            "origins": [o.isoformat() for o in data.origins()],
            "resumed_from_step": outcome.resumed_from_step,
            "world_size": ctx.world_size,
            "device": device.type,
            "learning_rate": start.learning_rate,
            "start": start.reason,
            "production_before": production.version if production else None,
            "settings": settings.train.model_dump(),
        },
    )


def _gate_and_report(
    registry: ModelRegistry,
    manifest: ModelManifest,
    data: SnapshotStream,
    settings: HybridflowSettings,
    started: float,
    device: str,
    history: list[EpochRecord] | None = None,
    plan: _TrainingPlan | None = None,
) -> TrainStageOutput:
    """Apply the gate to ``manifest`` (also a version an earlier run registered and may not have
    gated before it died) and report the stage's result."""
    judged = data.newest_origin()  # the test split the candidate's test metrics are of
    decision, promoted, production_version = gate_and_promote(
        registry, manifest, judged, settings.promotion_margin
    )
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
        n_test=judged.rows("test"),
        epochs=int(training.get("epochs", 0)),
        best_epoch=int(training.get("best_epoch", 0)),
        training_id=manifest.training_id,
        warm_start=manifest.warm_start,
        parent_version=manifest.parent_version,
        resumed_from_step=training.get("resumed_from_step"),
        steps=int(training.get("steps", 0)),
        checkpoints_uri=plan.checkpoints.uri() if plan else "",
        evaluation=ModelEvaluation.model_validate(manifest.evaluation)
        if manifest.evaluation
        else None,
    )
    return TrainStageOutput(result=result, decision=decision, history=history or [])


def _configure_threads(
    settings: HybridflowSettings, model: torch.nn.Module, processes: int
) -> None:
    """Torch threads on CPU: the setting, else one for small models (intra-op parallelism only
    adds overhead there), else the available cores shared among the local processes."""
    n_params = sum(p.numel() for p in model.parameters())
    small = n_params < SMALL_MODEL_PARAMS
    threads = configure_cpu_threads(settings.train.threads or (1 if small else None), processes)
    log.info("CPU training: %d torch threads per process (%d parameters)", threads, n_params)
