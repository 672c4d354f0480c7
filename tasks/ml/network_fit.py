"""Fitting a torch network family: the training loop of :mod:`tasks.ml.training_loop` with the
job's checkpoints (resumed from the newest valid one, saved in the background), its DDP ranks,
``torch.compile`` on CUDA, and the batch, learning rate and CPU threads the data's size and the
machine call for (:mod:`tasks.ml.network_plan`).

Any family whose model is an ``nn.Module`` from raw features to a logit (with a pydantic
``config``) fits through :func:`fit_network`; the family only builds the network and rebuilds
it from a checkpoint state.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from infra.settings import CheckpointSettings
from tasks.ml.checkpoints import CheckpointPolicy, LoadedCheckpoint
from tasks.ml.models.base import FitJob, torch_threads
from tasks.ml.network_plan import NetworkPlan, network_plan
from tasks.ml.training_loop import Progress, TrainOutcome, check_resume, train_model

log = logging.getLogger(__name__)


def fit_network(
    network: nn.Module,
    job: FitJob,
    learning_rate: float,
    rebuild: Callable[[dict[str, Any]], nn.Module],
) -> TrainOutcome:
    """Train ``network`` (or the newest valid checkpoint of ``job.checkpoints``, rebuilt by
    ``rebuild``) with early stopping; ``outcome.interrupted`` after ``job.stop_after_steps``.
    On CPU torch runs the plan's threads for the fit and the process's own after it (the
    backtest's one-thread plan used to stay for everything the process did next)."""
    plan = plan_fit(network, job, learning_rate)
    job = dataclasses.replace(
        job, settings=job.settings.model_copy(update={"batch_size": plan.batch_size})
    )
    threads = torch_threads(plan.threads) if job.device.type == "cpu" else nullcontext()
    with threads:
        outcome = _fit_planned(network, job, plan, rebuild)
    outcome.plan = plan
    return outcome


def _fit_planned(
    network: nn.Module,
    job: FitJob,
    plan: NetworkPlan,
    rebuild: Callable[[dict[str, Any]], nn.Module],
) -> TrainOutcome:
    """:func:`fit_network` once its plan is made and its threads set."""
    settings, ctx, device = job.settings, job.ctx, job.device.as_torch()
    resume: dict[str, Any] | None = None
    checkpoints = job.checkpoints
    if checkpoints is not None:
        resumed = resume_point(network, job, plan.learning_rate, rebuild)
        ctx.barrier()  # every rank has chosen its checkpoint before rank 0 may write a newer one
        if resumed is None:
            if checkpoints.skipped:
                log.warning(
                    "training %s starts fresh at step 0: none of its %d checkpoints can be "
                    "resumed (steps %s skipped, see above)",
                    checkpoints.training_id,
                    len(checkpoints.skipped),
                    ", ".join(map(str, checkpoints.skipped)),
                )
            else:
                log.info("training %s starts at step 0", checkpoints.training_id)
        else:
            network, loaded = resumed
            m = loaded.manifest
            log.info(
                "training %s resumed from checkpoint step %d (epoch %d, batch %d) at %s",
                checkpoints.training_id,
                m.step,
                m.epoch,
                m.batch,
                loaded.uri,
            )
            resume = loaded.state

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
            settings,
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
    return outcome


def resume_point(
    network: nn.Module,
    job: FitJob,
    learning_rate: float,
    rebuild: Callable[[dict[str, Any]], nn.Module],
) -> tuple[nn.Module, LoadedCheckpoint] | None:
    """The network rebuilt from the newest checkpoint that can continue this training, and that
    checkpoint; None when none can. A checkpoint that fails anywhere (its bytes, its state, a
    network other than ``network``'s, an optimiser or position that does not restore) is
    skipped with a warning naming it, like a checksum failure."""
    checkpoints = job.checkpoints
    assert checkpoints is not None
    for loaded in checkpoints.candidates():
        try:
            candidate = rebuild(loaded.state)
            same_network(candidate, network)
            check_resume(
                candidate,
                job.data,
                job.settings,
                job.device.as_torch(),
                loaded.state,
                learning_rate=learning_rate,
                ctx=job.ctx,
            )
        except Exception as exc:  # any failure means: not this one; the reason is logged
            checkpoints.skip(loaded.manifest.step, f"{loaded.uri}: {unusable_reason(exc)}")
            continue
        return candidate, loaded
    return None


def same_network(candidate: nn.Module, expected: nn.Module) -> None:
    """ValueError when a checkpoint's network is not the one this training fits (another
    family, architecture, feature list or normaliser)."""
    if type(candidate) is not type(expected):
        raise ValueError(
            f"it holds a {type(candidate).__name__}, this training fits a {type(expected).__name__}"
        )
    have, want = candidate.config.model_dump(), expected.config.model_dump()
    differ = sorted(k for k in have.keys() | want.keys() if have.get(k) != want.get(k))
    if differ:
        raise ValueError(f"it holds another network (its {', '.join(differ)} differ)")


def unusable_reason(exc: BaseException) -> str:
    """One line on why a checkpoint's state could not be used."""
    if isinstance(exc, KeyError):
        return f"its state lacks {exc.args[0]!r}" if exc.args else "its state is incomplete"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = "; ".join(lines[:2]) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:300]}"


def plan_fit(network: nn.Module, job: FitJob, learning_rate: float) -> NetworkPlan:
    """The batch, learning rate, warm-up and CPU threads for ``network`` on ``job``'s data (or
    the ``job.plan_rows`` it stands for; the threads matter on CPU only), logged."""
    n_params = sum(p.numel() for p in network.parameters())
    rows = job.data.rows("train")
    plan = network_plan(
        job.settings,
        train_rows=job.plan_rows or rows,
        parameters=n_params,
        learning_rate=learning_rate,
        processes=job.ctx.world_size,
        chunk_rows=job.data.chunk_rows,
    )
    planned_for = f" (planned for {job.plan_rows})" if job.plan_rows else ""
    log.info(
        "training %d parameters on %d rows%s: %s",
        n_params,
        rows,
        planned_for,
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
