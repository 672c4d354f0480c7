"""The training loop in plain PyTorch: streamed mini-batches, early stopping on validation log
loss, resumable checkpoints and DDP. Nothing here knows about Prefect or the registry.

Everything a resumed run needs is in :func:`training_state` (plain tensors and Python types, so
``torch.load(weights_only=True)`` reads it back): weights, optimiser, scheduler, best weights so
far, RNG state and the data position. Resuming from step ``s`` therefore gives the same weights as
never stopping (single process, CPU).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from infra.settings import TrainingSettings
from tasks.ml.checkpoints import CheckpointPolicy
from tasks.ml.ddp import DistContext
from tasks.ml.metrics import classification_metrics
from tasks.ml.model import CustomerMLP, ModelConfig, Normalizer, predict_proba
from tasks.ml.snapshot_reader import SnapshotStream

log = logging.getLogger(__name__)


@dataclass
class EpochRecord:
    """Metrics of one epoch."""

    epoch: int
    train_loss: float
    val_logloss: float
    val_auc: float
    seconds: float
    learning_rate: float = 0.0


@dataclass
class Progress:
    """Where training is: the data position, the step count and early-stopping bookkeeping."""

    epoch: int = 1
    batch: int = 0
    step: int = 0
    samples: int = 0
    best_logloss: float = math.inf
    best_epoch: int = 0
    stale: int = 0
    finished: bool = False
    history: list[dict[str, float]] = field(default_factory=list)


@dataclass
class TrainOutcome:
    """The best model (by validation log loss) and how training went."""

    model: CustomerMLP
    progress: Progress
    history: list[EpochRecord]
    seconds: float = 0.0
    steps_this_run: int = 0
    resumed_from_step: int | None = None
    checkpoints_written: int = 0
    interrupted: bool = False

    @property
    def best_epoch(self) -> int:
        return self.progress.best_epoch


SaveFn = Callable[[dict[str, Any], Progress], None]


def build_model(normalizer: Normalizer, settings: TrainingSettings) -> CustomerMLP:
    """A fresh model for the snapshot's features and normaliser (initialised from the seed)."""
    torch.manual_seed(settings.seed)
    return CustomerMLP(
        ModelConfig(
            features=normalizer.features,
            hidden_sizes=settings.hidden_sizes,
            dropout=settings.dropout,
            norm_mean=normalizer.mean,
            norm_std=normalizer.std,
        )
    )


def training_state(
    model: CustomerMLP,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    best_state: dict[str, torch.Tensor] | None,
    progress: Progress,
) -> dict[str, Any]:
    """Everything a resumed run needs, as plain tensors and Python types."""
    return {
        "model_config": model.config.model_dump(),
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "best_model": best_state or {},
        "rng_torch": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "progress": asdict(progress),
    }


def model_from_state(state: dict[str, Any]) -> CustomerMLP:
    """The network saved in a checkpoint state."""
    model = CustomerMLP(ModelConfig.model_validate(state["model_config"]))
    model.load_state_dict(state["model"])
    return model


def evaluate(model: CustomerMLP, data: SnapshotStream, split: str) -> dict[str, float]:
    """Metrics of ``model`` on ``split``, streamed chunk by chunk."""
    ys, ps = [], []
    was_training = model.training
    model.eval()
    for x, y in data.chunks(split):
        ys.append(y)
        ps.append(predict_proba(model, x))
    model.train(was_training)
    return classification_metrics(np.concatenate(ys), np.concatenate(ps))


def train_model(
    model: CustomerMLP,
    data: SnapshotStream,
    settings: TrainingSettings,
    device: torch.device,
    *,
    learning_rate: float | None = None,
    ctx: DistContext | None = None,
    resume: dict[str, Any] | None = None,
    save: SaveFn | None = None,
    policy: CheckpointPolicy | None = None,
    stop_after_steps: int | None = None,
    compile_model: bool = False,
) -> TrainOutcome:
    """Mini-batch AdamW on BCE loss with early stopping; checkpoints through ``save`` (rank 0)
    when ``policy`` says so; ``resume`` continues from a checkpoint state."""
    ctx = ctx or DistContext()
    started = time.perf_counter()
    model = model.to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=learning_rate or settings.learning_rate,
        weight_decay=settings.weight_decay,
    )
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=1)
    progress, best_state = Progress(), None
    torch.manual_seed(settings.seed + ctx.rank)  # dropout masks differ per rank
    if resume is not None:
        model.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        scheduler.load_state_dict(resume["scheduler"])
        best_state = resume["best_model"] or None
        progress = Progress(**resume["progress"])
        if ctx.distributed:
            torch.manual_seed(settings.seed + ctx.rank + 7919 * progress.step)
        else:
            torch.set_rng_state(resume["rng_torch"])
            if device.type == "cuda" and resume["rng_cuda"]:
                torch.cuda.set_rng_state_all(resume["rng_cuda"])
    outcome = TrainOutcome(
        model=model,
        progress=progress,
        history=[EpochRecord(**h) for h in progress.history],
        resumed_from_step=progress.step if resume is not None else None,
    )
    net: nn.Module = model
    if ctx.distributed:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    eager = net
    if compile_model:
        net = torch.compile(net)
    loss_fn = nn.BCEWithLogitsLoss()
    on_cuda = device.type == "cuda"

    def checkpoint() -> None:
        if save is not None and ctx.is_main:
            save(training_state(model, optimizer, scheduler, best_state, progress), progress)
            outcome.checkpoints_written += 1
        if policy is not None:
            policy.mark(progress.step)

    while not progress.finished:
        epoch, t0 = progress.epoch, time.perf_counter()
        net.train()
        loss_sum = torch.zeros((), device=device)
        n_batches = 0
        for g, xb, yb in data.minibatches(
            seed=settings.seed,
            epoch=epoch,
            batch_size=settings.batch_size,
            start=progress.batch,
            rank=ctx.rank,
            world_size=ctx.world_size,
            pin_memory=on_cuda,
        ):
            xb = xb.to(device, non_blocking=True)
            yb = yb.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_cuda):
                try:
                    logits = net(xb)
                except Exception as exc:  # a compile backend failing on this machine's toolchain
                    if net is eager:
                        raise
                    log.warning("torch.compile failed (%s); continuing without it", exc)
                    net = eager
                    logits = net(xb)
                loss = loss_fn(logits.float(), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
            n_batches += 1
            progress.step += 1
            progress.samples += len(yb) * ctx.world_size
            progress.batch = g - ctx.rank + ctx.world_size
            outcome.steps_this_run += 1
            if policy is not None and policy.due(progress.step):
                checkpoint()
            if stop_after_steps and outcome.steps_this_run >= stop_after_steps:
                if policy is None or policy.last_step_saved != progress.step:
                    checkpoint()
                outcome.interrupted = True
                outcome.seconds = time.perf_counter() - started
                log.info(
                    "stopping after %d steps this run (step %d)", stop_after_steps, progress.step
                )
                return outcome
        model.eval()
        val = evaluate(model, data, "val")
        val["logloss"], val["auc"] = ctx.broadcast_from_main([val["logloss"], val["auc"]], device)
        scheduler.step(val["logloss"])
        record = EpochRecord(
            epoch=epoch,
            train_loss=float(loss_sum) / max(n_batches, 1),
            val_logloss=val["logloss"],
            val_auc=val["auc"],
            seconds=time.perf_counter() - t0,
            learning_rate=float(optimizer.param_groups[0]["lr"]),
        )
        outcome.history.append(record)
        progress.history.append(asdict(record))
        if ctx.is_main:
            log.info(
                "epoch %d: train loss %.4f, val logloss %.4f, val AUC %.4f, lr %.2g (%.1fs, step %d)",
                epoch,
                record.train_loss,
                record.val_logloss,
                record.val_auc,
                record.learning_rate,
                record.seconds,
                progress.step,
            )
        if record.val_logloss < progress.best_logloss - 1e-5:
            progress.best_logloss, progress.best_epoch, progress.stale = (
                record.val_logloss,
                epoch,
                0,
            )
            best_state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        else:
            progress.stale += 1
        progress.epoch, progress.batch = epoch + 1, 0
        if progress.stale >= settings.patience or epoch >= settings.max_epochs:
            if ctx.is_main and progress.stale >= settings.patience:
                log.info("early stop after epoch %d (best epoch %d)", epoch, progress.best_epoch)
            progress.finished = True
            checkpoint()
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    outcome.seconds = time.perf_counter() - started
    return outcome
