"""The train stage: every contending model family fitted (resumably), evaluated and registered
-> the champion -> promotion gate. Runs as one process or as every rank of a torchrun DDP job.

:func:`launch_training` is the one entry point: the ``train`` flow calls it, and it either trains
here or starts ``torchrun -m tasks.stages.train_process``, whose ranks call
:func:`train_stage` and whose rank 0 hands back the same typed :class:`TrainStageOutput`.
Which families contend: ``TrainingOptions.families``, else ``HYBRIDFLOW_TRAIN__FAMILIES``; each
is fitted, calibrated and backtested the same way (:mod:`tasks.policy.contending`), registered
as its own version, and only the champion (:mod:`tasks.ml.champion`) goes to the gate. A
contender that its own unit of the run already fitted (the pipeline dispatches one per family,
in parallel) is read back from the store instead of fitted here.
"""

from __future__ import annotations

import datetime as dt
import logging
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

from infra.compute.devices import configure_accelerator
from infra.errors import HybridflowInputError
from infra.routing.accounting import embedded_pool
from infra.settings import HybridflowSettings
from infra.storage.registry import ModelRegistry
from infra.storage.store import ObjectStore
from infra.warm_imports import finish_warm_imports
from tasks.ml.baseline import BASELINE_FAMILY
from tasks.ml.champion import LeaderboardRow, champion_line, crown, judged_figures, judging_basis
from tasks.ml.ddp import init_distributed, launch_ddp_training
from tasks.ml.epoch_record import EpochRecord
from tasks.ml.evaluation import ModelEvaluation
from tasks.ml.gate import RecipeBacktest, gate_and_promote
from tasks.ml.models import FamilySpec, family_specs
from tasks.ml.promotion import GateFigures, PromotionDecision
from tasks.ml.quality import run_backtest
from tasks.ml.snapshot_reader import SnapshotStream, shared_reads
from tasks.ml.warm_start import CODE_VERSION
from tasks.policy.contending import (
    MIN_EXAMPLES_PER_CLASS,
    Contender,
    TrainingInterrupted,
    TrainingOptions,
    check_trainable,
    contend,
    opened_snapshot,
    published_contender,
)
from tasks.reporting.records import (
    FeaturesResult,
    PreprocessResult,
    StageReport,
    TrainResult,
)

__all__ = [
    "CODE_VERSION",
    "MIN_EXAMPLES_PER_CLASS",
    "TrainStageOutput",
    "TrainingInterrupted",
    "TrainingOptions",
    "check_trainable",
    "launch_training",
    "train_stage",
]

log = logging.getLogger(__name__)


class TrainStageOutput(BaseModel):
    """What rank 0 reports: the result, the gate's decision and the champion's epoch history."""

    result: TrainResult
    decision: PromotionDecision
    history: list[EpochRecord]


def launch_training(
    store: ObjectStore,
    run_id: str,
    settings: HybridflowSettings,
    *,
    features: FeaturesResult,
    preprocess: PreprocessResult,
    device_preference: str = "auto",
    options: TrainingOptions | None = None,
) -> TrainStageOutput:
    """Train on the run's snapshot (``preprocess``; T and H from ``features``) in this process,
    or under torchrun on ``HYBRIDFLOW_TRAIN__DDP_PROCESSES`` devices, whose processes read the
    same results of run ``run_id`` from the store (rank 0 writes its output as JSON)."""
    options = (options or TrainingOptions()).of_run(features)
    if settings.train.ddp_processes <= 1:
        output = train_stage(
            store,
            preprocess,
            settings,
            as_of=features.as_of,
            horizon_days=features.horizon_days,
            device_preference=device_preference,
            options=options,
            run_id=run_id,
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


def train_stage(
    store: ObjectStore,
    prepared: PreprocessResult,
    settings: HybridflowSettings,
    *,
    as_of: dt.date,
    horizon_days: int,
    device_preference: str = "auto",
    options: TrainingOptions | None = None,
    run_id: str | None = None,
) -> TrainStageOutput | None:
    """Every contending family — the one its own unit of run ``run_id`` published, else fitted
    here (resuming its training id's newest valid checkpoint, or reusing the version an earlier
    run registered for it) — judged and registered; the champion crowned and gated. Returns
    None on ranks other than 0."""
    options = options or TrainingOptions()
    started = time.perf_counter()
    finish_warm_imports()
    specs = family_specs(options.families or settings.train.families, settings.train.specs)
    ctx, device = init_distributed(device_preference)
    configure_accelerator(device)
    with shared_reads(), opened_snapshot(store, prepared, settings) as opened:
        data = opened.data
        check_trainable(data, as_of, horizon_days)
        contenders: list[Contender] = []
        for spec in specs:
            contender = published_contender(store, run_id, spec.kind) if run_id else None
            if contender is None:
                contender = contend(
                    store,
                    opened,
                    prepared,
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
                store,
                prepared,
                data.newest_origin(),
                spec,
                settings,
                device,
                as_of,
                horizon_days,
                data.rows("train"),
            )
            if report.result is None:
                raise ValueError(f"the backtest of {spec.kind} was skipped: {report.reason}")
            return GateFigures(logloss=report.result.model.logloss, auc=report.result.model.auc)

        return _crown_and_gate(
            opened.registry,
            contenders,
            data,
            settings,
            options,
            started,
            device.type,
            recipe_backtest,
        )


def leaderboard_row(contender: Contender, basis: str, pool: str) -> LeaderboardRow:
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
    registry: ModelRegistry, contender: Contender, board: list[LeaderboardRow]
) -> Contender:
    """The contender with its version registered (this run's leaderboard in its manifest)."""
    if contender.files is None:
        return contender
    fields = contender.manifest.model_dump(exclude={"created_at", "files"})
    manifest = registry.register(
        contender.files, **fields | {"leaderboard": [r.model_dump(mode="json") for r in board]}
    )
    log.info("%s: registered as %s", manifest.kind, manifest.version)
    return Contender(
        manifest, contender.history, False, contender.checkpoints_uri, start=contender.start
    )


def _crown_and_gate(
    registry: ModelRegistry,
    contenders: list[Contender],
    data: SnapshotStream,
    settings: HybridflowSettings,
    options: TrainingOptions,
    started: float,
    device: str,
    recipe_backtest: RecipeBacktest,
) -> TrainStageOutput:
    """Rank the contenders, apply the gate to the champion (also a version an earlier run
    registered and may not have gated before it died; the gate may judge the run's ``rfm``
    contender in its place) and report the stage's result, of the version the gate decided on."""
    evaluations = [ModelEvaluation.model_validate(c.manifest.evaluation) for c in contenders]
    basis = judging_basis(evaluations)
    pool = options.pool or embedded_pool(device)
    board = crown([leaderboard_row(c, basis, pool) for c in contenders])
    log.info("champion: %s", champion_line(board))
    contenders = [_registered(registry, c, board) for c in contenders]
    judged = data.newest_origin()  # the test split the candidate's test metrics are of
    gate = gate_and_promote(
        registry,
        next(c.manifest for c in contenders if c.manifest.version == board[0].version),
        [c.manifest for c in contenders],
        judged,
        settings.promotion_margin,
        basis=basis,
        recipe_backtest=recipe_backtest,
    )
    decision, promoted, production_version = gate.decision, gate.promoted, gate.production_version
    gated = next(c for c in contenders if c.manifest.version == gate.candidate.version)
    manifest = gated.manifest
    if not promoted and registry.alias() is None:
        raise HybridflowInputError(
            f"no model to score with: this run's champion {manifest.version} ({manifest.kind}) "
            f"was not promoted ({decision.reason}) and there is no production model yet; "
            f"fix: {no_model_fixes(manifest.version, [c.manifest.kind for c in contenders])}"
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
        checkpoints_uri=gated.checkpoints_uri,
        evaluation=ModelEvaluation.model_validate(manifest.evaluation)
        if manifest.evaluation
        else None,
        leaderboard=board,
        champion_reason=champion_line(board),
        start_reason=gated.start or str(training.get("start", "")),
    )
    return TrainStageOutput(result=result, decision=decision, history=gated.history)


def no_model_fixes(version: str, families: list[str]) -> str:
    """What a user can do when a first run's champion was refused (``families``: the kinds that
    contended): add the baseline's recipe when it did not contend, serve the champion anyway,
    or give the run more history."""
    fixes = []
    if BASELINE_FAMILY not in families:
        fixes.append(
            f"add the {BASELINE_FAMILY} family (the RFM baseline's recipe, which the gate "
            f"accepts: `--families {','.join([BASELINE_FAMILY, *families])}` or "
            "HYBRIDFLOW_TRAIN__FAMILIES)"
        )
    fixes.append(f"serve it anyway with `hybridflow models promote {version}`")
    fixes.append(
        "give the run more history (a longer event log) so that a contender beats the baseline"
    )
    return ", or ".join(fixes)
