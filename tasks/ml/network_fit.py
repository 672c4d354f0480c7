"""Fitting a torch network family: the training loop of :mod:`tasks.ml.training_loop` with the
job's checkpoints (resumed from the newest valid one, saved in the background), its DDP ranks,
``torch.compile`` on CUDA, and the batch, learning rate and CPU threads the data's size and the
machine call for (:mod:`tasks.ml.network_plan`).

Any family whose model is an ``nn.Module`` from raw features to a logit (with a pydantic
``config``) fits through :func:`fit_network`; the family only builds the network and rebuilds
it from a checkpoint state.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from infra.settings import CheckpointSettings
from tasks.ml.checkpoints import CheckpointPolicy
from tasks.ml.models.base import FitJob
from tasks.ml.network_plan import NetworkPlan, network_plan
from tasks.ml.training_loop import Progress, TrainOutcome, train_model

log = logging.getLogger(__name__)


def fit_network(
    network: nn.Module,
    job: FitJob,
    learning_rate: float,
    rebuild: Callable[[dict[str, Any]], nn.Module],
) -> TrainOutcome:
    """Train ``network`` (or the newest valid checkpoint of ``job.checkpoints``, rebuilt by
    ``rebuild``) with early stopping; ``outcome.interrupted`` after ``job.stop_after_steps``."""
    settings, ctx, device = job.settings, job.ctx, job.device
    plan = plan_fit(network, job, learning_rate)
    if device.type == "cpu":
        torch.set_num_threads(plan.threads)
    resume: dict[str, Any] | None = None
    checkpoints = job.checkpoints
    if checkpoints is not None:
        loaded = checkpoints.latest_valid()
        ctx.barrier()  # every rank has chosen its checkpoint before rank 0 may write a newer one
        if loaded is None:
            log.info("training %s starts at step 0", checkpoints.training_id)
        else:
            m = loaded.manifest
            log.info(
                "training %s resumed from checkpoint step %d (epoch %d, batch %d) at %s",
                checkpoints.training_id,
                m.step,
                m.epoch,
                m.batch,
                loaded.uri,
            )
            network, resume = rebuild(loaded.state), loaded.state

    def save(state: dict, progress: Progress) -> None:
        assert checkpoints is not None
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

    compile_model = settings.compile if settings.compile is not None else device.type == "cuda"
    try:
        outcome = train_model(
            network,
            job.data,
            settings.model_copy(update={"batch_size": plan.batch_size}),
            device,
            learning_rate=plan.learning_rate,
            warmup_steps=plan.warmup_steps,
            ctx=ctx,
            resume=resume,
            save=save if checkpoints is not None else None,
            policy=(job.checkpoint_policy or CheckpointPolicy.of(CheckpointSettings()))
            if checkpoints is not None
            else None,
            stop_after_steps=job.stop_after_steps,
            compile_model=compile_model,
        )
        if checkpoints is not None:
            checkpoints.wait()  # the last upload must have landed
    finally:
        if checkpoints is not None:
            checkpoints.close()
    outcome.plan = plan
    return outcome


def plan_fit(network: nn.Module, job: FitJob, learning_rate: float) -> NetworkPlan:
    """The batch, learning rate, warm-up and CPU threads for ``network`` on ``job``'s data (the
    threads matter on CPU only), logged."""
    n_params = sum(p.numel() for p in network.parameters())
    plan = network_plan(
        job.settings,
        train_rows=job.data.rows("train"),
        parameters=n_params,
        learning_rate=learning_rate,
        processes=job.ctx.world_size,
        chunk_rows=job.data.chunk_rows,
    )
    log.info(
        "training %d parameters on %d rows: %s",
        n_params,
        job.data.rows("train"),
        plan.describe(cpu=job.device.type == "cpu"),
    )
    return plan


def outcome_record(outcome: TrainOutcome, learning_rate: float, world_size: int) -> dict[str, Any]:
    """The training figures a network's version records (``learning_rate``: the one asked for;
    the plan's scaled rate, batch and threads beside it)."""
    plan = outcome.plan
    return {
        "epochs": len(outcome.history),
        "best_epoch": outcome.best_epoch,
        "steps": outcome.progress.step,
        "samples_seen": outcome.progress.samples,
        "resumed_from_step": outcome.resumed_from_step,
        "world_size": world_size,
        "learning_rate": learning_rate,
    } | (
        {
            "batch_size": plan.batch_size,
            "scaled_learning_rate": plan.learning_rate,
            "warmup_steps": plan.warmup_steps,
            "threads": plan.threads,
        }
        if plan is not None
        else {}
    )


def state_dict_cpu(network: nn.Module) -> dict[str, torch.Tensor]:
    """The network's weights as plain CPU tensors (what ``torch.save`` writes in a bundle)."""
    return {k: v.detach().cpu() for k, v in network.state_dict().items()}
