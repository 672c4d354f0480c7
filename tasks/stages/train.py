"""The train stage: snapshot in the store -> every contending model family fitted (resumably),
evaluated and registered -> the champion -> promotion gate. Runs as one process or as every rank
of a torchrun DDP job.

:func:`launch_training` is the one entry point: the ``train`` flow calls it, and it either trains
here or starts ``torchrun -m tasks.stages.train_process``, whose ranks call
:func:`train_for_run` and whose rank 0 hands back the same typed :class:`TrainStageOutput`.
Which families contend: ``TrainingOptions.families``, else ``HYBRIDFLOW_TRAIN__FAMILIES``; each
is fitted, calibrated and backtested the same way (:mod:`tasks.ml.models`), registered as its
own version, and only the champion (:mod:`tasks.ml.champion`) goes to the gate.
"""

from __future__ import annotations

import datetime as dt
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import BaseModel

from infra.datasets import local_dataset_dir, read_dataset_manifest, release_local_dir
from infra.devices import configure_accelerator
from infra.errors import HybridflowInputError
from infra.registry import AliasRecord, ModelManifest, ModelRegistry, new_version_id
from infra.routing.accounting import embedded_pool
from infra.settings import HybridflowSettings
from infra.store import ObjectStore, sha256_bytes
from infra.warm_imports import finish_warm_imports
from tasks.ml.champion import LeaderboardRow, champion_line, crown, judged_figures, judging_basis
from tasks.ml.checkpoints import CheckpointPolicy, CheckpointStore
from tasks.ml.ddp import DistContext, init_distributed, launch_ddp_training
from tasks.ml.evaluation import ModelEvaluation
from tasks.ml.models import FamilySpec, FitJob, FitOutcome, family_specs, get_family
from tasks.ml.normalizer import Normalizer
from tasks.ml.promotion import GateFigures, PromotionDecision
from tasks.ml.snapshot_reader import SnapshotStream
from tasks.ml.training_loop import EpochRecord
from tasks.ml.warm_start import CODE_VERSION, StartPoint, choose_start, training_id
from tasks.stages.gate import RecipeBacktest, gate_and_promote
from tasks.stages.quality import judge_candidate, run_backtest
from tasks.stages.records import (
    FeaturesResult,
    PreprocessResult,
    StageReport,
    TrainResult,
    read_stage_manifest,
)

log = logging.getLogger(__name__)


class TrainingOptions(BaseModel):
    """Per-run switches of the train stage."""

    fresh: bool = False
    scratch: bool = False
    stop_after_steps: int | None = None
    families: list[str] | None = None  # None: HYBRIDFLOW_TRAIN__FAMILIES
    pool: str = ""  # the work pool running the stage ("": this machine's, by its device)
    scoring_features: str | None = None  # the run's scoring features, recorded in each version


class TrainingInterrupted(RuntimeError):
    """Training stopped early on purpose (``stop_after_steps``) with a checkpoint to resume from."""


class TrainStageOutput(BaseModel):
    """What rank 0 reports: the result, the gate's decision and the champion's epoch history."""

    result: TrainResult
    decision: PromotionDecision
    history: list[EpochRecord]


@dataclass
class _Contender:
    """A contender: its version's manifest (registered by an earlier run, or to be registered
    with the leaderboard once every contender is judged) and what this run did to get it."""

    manifest: ModelManifest
    history: list[EpochRecord]
    reused: bool
    checkpoints_uri: str
    files: dict[str, bytes] | None = None  # the bundle of a version not registered yet
    start: str = ""  # where this run's fit started (warm start from production, or why not)


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
    if options.families:
        args += ["--families", ",".join(options.families)]
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
    options = (options or TrainingOptions()).model_copy(
        update={"scoring_features": features.scoring_prefix}
    )
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
    """Fit every contending family (each resuming its training id's newest valid checkpoint, or
    reusing the version an earlier run registered for it), judge and register each, crown the
    champion and apply the gate to it. Returns None on ranks other than 0."""
    options = options or TrainingOptions()
    started = time.perf_counter()
    finish_warm_imports()
    specs = family_specs(options.families or settings.train.families, settings.train.specs)
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
        check_trainable(data, as_of, horizon_days)
        registry = ModelRegistry(store)
        production = registry.alias()
        fingerprint = data.fingerprint()
        contenders: list[_Contender] = []
        for spec in specs:
            contender = _contend(
                store,
                registry,
                production,
                prepared,
                data,
                normalizer,
                fingerprint,
                spec,
                settings,
                options,
                ctx,
                device,
                as_of,
                horizon_days,
            )
            if contender is not None:
                contenders.append(contender)
        if not ctx.is_main:
            return None

        def recipe_backtest(spec: FamilySpec) -> GateFigures:
            report = run_backtest(
                store, prepared, data.newest_origin(), spec, settings, device, as_of, horizon_days
            )
            if report.result is None:
                raise ValueError(f"the backtest of {spec.kind} was skipped: {report.reason}")
            return GateFigures(logloss=report.result.model.logloss, auc=report.result.model.auc)

        return _crown_and_gate(
            registry, contenders, data, settings, options, started, device.type, recipe_backtest
        )
    finally:
        release_local_dir(store, local)


MIN_EXAMPLES_PER_CLASS = 5  # in every split: what fitting, calibrating and judging need


def check_trainable(data: SnapshotStream, as_of: dt.date, horizon_days: int) -> None:
    """HybridflowInputError naming the cause and the fix when no family could produce a model
    from the snapshot: no examples, one class only, or too few of a class in a split."""
    window = f"({as_of - dt.timedelta(days=horizon_days)}, {as_of}]"
    counts = {}
    for split in data.splits:
        labels = [y for _, y in data.chunks(split)]
        positives = int(sum(float(y.sum()) for y in labels))
        counts[split] = (data.rows(split), positives)
    rows = sum(n for n, _ in counts.values())
    positives = sum(p for _, p in counts.values())
    fix = (
        "fix: give more history (events before the window), or choose --as-of / "
        "--horizon-days so that some, but not all, customers buy in the window"
    )
    if rows == 0:
        raise HybridflowInputError(
            f"no training examples: no customer has events before the label window {window}; {fix}"
        )
    if positives in (0, rows):
        who = "no customer" if positives == 0 else "every customer"
        raise HybridflowInputError(
            f"all {rows} training examples have one class: {who} bought in the label window "
            f"{window}, and no model can learn from one class; {fix}"
        )
    short = [
        f"{split} {n} rows, {p} buying"
        for split, (n, p) in counts.items()
        if min(p, n - p) < MIN_EXAMPLES_PER_CLASS
    ]
    if short:
        raise HybridflowInputError(
            f"too few training examples to fit and judge a model ({'; '.join(short)}; every "
            f"split needs at least {MIN_EXAMPLES_PER_CLASS} customers who bought in {window} and "
            f"{MIN_EXAMPLES_PER_CLASS} who did not): more customers are needed; {fix}"
        )


def _contend(
    store: ObjectStore,
    registry: ModelRegistry,
    production: AliasRecord | None,
    prepared: PreprocessResult,
    data: SnapshotStream,
    normalizer: Normalizer,
    fingerprint: str,
    spec: FamilySpec,
    settings: HybridflowSettings,
    options: TrainingOptions,
    ctx: DistContext,
    device: torch.device,
    as_of: dt.date,
    horizon_days: int,
) -> _Contender | None:
    """One family: the version an earlier run registered for this training id, else a fit
    (from its newest valid checkpoint, or production when it warm-starts), its judgement and
    registration. None on ranks other than 0."""
    start = choose_start(registry, production, normalizer, spec, settings.train, options.scratch)
    tid = training_id(fingerprint, spec, settings.train, start)
    checkpoints = CheckpointStore(store, tid, keep=settings.checkpoint.keep)
    done = None if options.fresh else registry.find_training(tid)
    if done is not None:
        log.info(
            "%s: training %s finished before as version %s: reusing it (--fresh refits)",
            spec.kind,
            tid,
            done.version,
        )
        start_reason = f"{start.reason} (the same fit as version {done.version}, reused)"
        return (
            _Contender(done, [], True, checkpoints.uri(), start=start_reason)
            if ctx.is_main
            else None
        )
    log.info(
        "%s: training %s: %s; checkpoints at %s", spec.kind, tid, start.reason, checkpoints.uri()
    )
    if options.fresh and ctx.is_main:
        removed = checkpoints.clear()
        log.info("--fresh: training %s starts over (%d checkpoints removed)", tid, removed)
    ctx.barrier()
    outcome = get_family(spec.kind).fit(
        spec,
        FitJob(
            data=data,
            normalizer=normalizer,
            settings=settings.train,
            device=device,
            ctx=ctx,
            start=start.model,
            checkpoints=checkpoints,
            checkpoint_policy=CheckpointPolicy(
                settings.checkpoint.every_steps, settings.checkpoint.every_seconds
            ),
            stop_after_steps=options.stop_after_steps,
        ),
    )
    if outcome.interrupted:
        raise TrainingInterrupted(
            f"training {tid} ({spec.kind}) stopped after {options.stop_after_steps} steps at "
            f"step {outcome.record.get('steps')}; run again to resume from its checkpoint"
        )
    if not ctx.is_main:
        return None
    judged = time.perf_counter()
    model, evaluation = judge_candidate(
        store, prepared, outcome.model, spec, data, settings, device, as_of, horizon_days
    )
    files = model.bundle_files()
    manifest = ModelManifest(
        version=new_version_id(),
        created_at=dt.datetime.now(dt.UTC),
        files={name: sha256_bytes(body) for name, body in files.items()},
        kind=spec.kind,
        metrics=evaluation.flat_metrics()
        | {
            "n_train": float(data.rows("train")),
            "n_test": float(data.newest_origin().rows("test")),
        },
        evaluation=evaluation.model_dump(mode="json"),
        features=model.features,
        data_fingerprint=fingerprint,
        parent_version=start.parent_version,
        warm_start=start.warm_start,
        training_id=tid,
        code_version=CODE_VERSION,
        as_of=as_of,
        horizon_days=horizon_days,
        scoring_features=options.scoring_features,
        snapshot=prepared.snapshot_prefix,
        training=_training_record(
            outcome, start, production, spec, model.describe(), model.n_parameters, settings
        )
        | {
            "device": outcome.record.get("device", device.type),
            "pool": options.pool or embedded_pool(device.type),
            "judge_seconds": time.perf_counter() - judged,
            "origins": [o.isoformat() for o in data.origins()],
        },
    )
    log.info("%s: judged (%s)", spec.kind, model.describe())
    return _Contender(manifest, outcome.history, False, checkpoints.uri(), files, start.reason)


def _training_record(
    outcome: FitOutcome,
    start: StartPoint,
    production: AliasRecord | None,
    spec: FamilySpec,
    description: str,
    parameters: int,
    settings: HybridflowSettings,
) -> dict:
    """What the version's manifest says about how it was fitted."""
    return outcome.record | {
        "family": spec.kind,
        "spec": spec.model_dump(mode="json"),
        "parameters": parameters,
        "description": description,
        "fit_seconds": outcome.seconds,
        "start": start.reason,
        "production_before": production.version if production else None,
        "settings": settings.train.model_dump(mode="json"),
    }


def leaderboard_row(contender: _Contender, basis: str, pool: str) -> LeaderboardRow:
    """A registered contender's row (its figures from its manifest's evaluation)."""
    manifest = contender.manifest
    evaluation = ModelEvaluation.model_validate(manifest.evaluation)
    training = manifest.training
    fit = float(training.get("fit_seconds", 0.0))
    return LeaderboardRow(
        family=manifest.kind,
        version=manifest.version,
        size=int(training.get("parameters", 0)),
        description=str(training.get("description", manifest.kind)),
        basis=basis,  # type: ignore[arg-type]
        **judged_figures(evaluation, basis),  # type: ignore[arg-type]
        test_auc=evaluation.test.model.auc,
        test_logloss=evaluation.test.model.logloss,
        train_seconds=fit,
        seconds=fit + float(training.get("judge_seconds", 0.0)),
        device=str(training.get("device", "cpu")),
        pool=str(training.get("pool") or pool),
        reused=contender.reused,
    )


def _registered(
    registry: ModelRegistry, contender: _Contender, board: list[LeaderboardRow]
) -> _Contender:
    """The contender with its version registered (this run's leaderboard in its manifest)."""
    if contender.files is None:
        return contender
    fields = contender.manifest.model_dump(exclude={"created_at", "files"})
    manifest = registry.register(
        contender.files, **fields | {"leaderboard": [r.model_dump(mode="json") for r in board]}
    )
    log.info("%s: registered as %s", manifest.kind, manifest.version)
    return _Contender(
        manifest, contender.history, False, contender.checkpoints_uri, start=contender.start
    )


def _crown_and_gate(
    registry: ModelRegistry,
    contenders: list[_Contender],
    data: SnapshotStream,
    settings: HybridflowSettings,
    options: TrainingOptions,
    started: float,
    device: str,
    recipe_backtest: RecipeBacktest,
) -> TrainStageOutput:
    """Rank the contenders, apply the gate to the champion (also a version an earlier run
    registered and may not have gated before it died) and report the stage's result."""
    evaluations = [ModelEvaluation.model_validate(c.manifest.evaluation) for c in contenders]
    basis = judging_basis(evaluations)
    pool = options.pool or embedded_pool(device)
    board = crown([leaderboard_row(c, basis, pool) for c in contenders])
    log.info("champion: %s", champion_line(board))
    contenders = [_registered(registry, c, board) for c in contenders]
    champion = next(c for c in contenders if c.manifest.version == board[0].version)
    manifest = champion.manifest
    judged = data.newest_origin()  # the test split the candidate's test metrics are of
    decision, promoted, production_version = gate_and_promote(
        registry,
        manifest,
        [c.manifest for c in contenders],
        judged,
        settings.promotion_margin,
        basis=basis,
        recipe_backtest=recipe_backtest,
    )
    if not promoted and registry.alias() is None:
        raise HybridflowInputError(
            f"no model to score with: this run's champion {manifest.version} ({manifest.kind}) "
            f"was not promoted ({decision.reason}) and there is no production model yet; "
            f"fix: serve it anyway with `hybridflow models promote {manifest.version}`, or give "
            "the run more history (a longer event log) so that a contender beats the baseline"
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
        family=manifest.kind,
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
        checkpoints_uri=champion.checkpoints_uri,
        evaluation=ModelEvaluation.model_validate(manifest.evaluation)
        if manifest.evaluation
        else None,
        leaderboard=board,
        champion_reason=champion_line(board),
        start_reason=champion.start or str(training.get("start", "")),
    )
    return TrainStageOutput(result=result, decision=decision, history=champion.history)
