"""The contender unit: one model family of a training run fitted, calibrated and backtested on
the run's snapshot (:func:`tasks.policy.contending.contend`) and kept in the store for the train
stage, in this process or under torchrun.

A contender runs in the train stage's own process, or as its own dispatch unit (the
``contender`` flow, one flow run per family, on the pool the router chose for that family, all
of a run's at once). The train stage finds the units' results in the store, registers every
contender with the run's leaderboard, crowns the champion and gates it
(:mod:`tasks.stages.train`).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from infra.compute.devices import configure_accelerator
from infra.settings import HybridflowSettings
from infra.storage.store import ObjectStore
from infra.warm_imports import finish_warm_imports
from tasks.ml.ddp import init_distributed, launch_ddp_training
from tasks.ml.models import family_specs
from tasks.policy.contending import (
    ContenderResult,
    TrainingOptions,
    check_trainable,
    contend,
    kept_for_the_run,
    opened_snapshot,
)
from tasks.reporting.records import (
    FeaturesResult,
    PreprocessResult,
    StageReport,
    contender_stage,
)


def fit_contender(
    store: ObjectStore,
    run_id: str,
    settings: HybridflowSettings,
    family: str,
    *,
    features: FeaturesResult,
    preprocess: PreprocessResult,
    device_preference: str = "auto",
    options: TrainingOptions | None = None,
) -> ContenderResult | None:
    """The contender unit of ``family`` in run ``run_id``: fit and judge it on the run's
    snapshot (``preprocess``; T and H from ``features``) and keep it in the store. None on
    ranks other than 0."""
    options = (options or TrainingOptions()).of_run(features)
    started = time.perf_counter()
    finish_warm_imports()
    (spec,) = family_specs([family], settings.train.specs)
    prepared = preprocess
    ctx, device = init_distributed(device_preference)
    configure_accelerator(device)
    with opened_snapshot(store, prepared, settings) as opened:
        check_trainable(opened.data, features.as_of, features.horizon_days)
        contender = contend(
            store,
            opened,
            prepared,
            spec,
            settings,
            options,
            ctx,
            device,
            features.as_of,
            features.horizon_days,
        )
        rows = sum(opened.data.rows(s) for s in opened.data.splits)
    if contender is None:
        return None
    report = StageReport(
        name=contender_stage(family),
        seconds=time.perf_counter() - started,
        device=str(contender.manifest.training.get("device", device.type)),
        rows_in=rows,
    )
    return kept_for_the_run(store, run_id, contender, report)


def launch_contender(
    store: ObjectStore,
    run_id: str,
    settings: HybridflowSettings,
    family: str,
    *,
    features: FeaturesResult,
    preprocess: PreprocessResult,
    device_preference: str = "auto",
    options: TrainingOptions | None = None,
) -> ContenderResult:
    """The contender unit in this process, or under torchrun on
    ``HYBRIDFLOW_TRAIN__DDP_PROCESSES`` devices, whose processes read the same results of run
    ``run_id`` from the store (rank 0 writes its result as JSON)."""
    options = options or TrainingOptions()
    if settings.train.ddp_processes <= 1:
        result = fit_contender(
            store,
            run_id,
            settings,
            family,
            features=features,
            preprocess=preprocess,
            device_preference=device_preference,
            options=options,
        )
        assert result is not None  # a single process is rank 0
        return result
    args = ["--run-id", run_id, "--store", store.uri, "--device", device_preference]
    args += ["--fresh"] * options.fresh + ["--scratch"] * options.scratch
    args += ["--contender", family]
    with tempfile.TemporaryDirectory(prefix="hf-ddp-") as tmp:
        result_file = Path(tmp) / "result.json"
        launch_ddp_training(settings.train.ddp_processes, args, result_file)
        return ContenderResult.model_validate_json(result_file.read_text())
