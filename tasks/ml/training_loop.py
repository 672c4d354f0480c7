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
from tasks.ml.adamw import Optimiser, loop_optimizer
from tasks.ml.checkpoints import CheckpointPolicy
from tasks.ml.ddp import DistContext
from tasks.ml.epoch_record import EpochRecord
from tasks.ml.logistic import sigmoid
from tasks.ml.metrics import log_loss, roc_auc
from tasks.ml.plateau import ReduceOnPlateau
from tasks.ml.snapshot_reader import SnapshotStream

log = logging.getLogger(__name__)


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

    model: nn.Module
    progress: Progress
    history: list[EpochRecord]
    seconds: float = 0.0
    steps_this_run: int = 0
    resumed_from_step: int | None = None
    checkpoints_written: int = 0
    interrupted: bool = False
    plan: Any = None  # the NetworkPlan the fit ran with (set by tasks.ml.network_fit)

    @property
    def best_epoch(self) -> int:
        return self.progress.best_epoch


SaveFn = Callable[[dict[str, Any], Progress], None]


def training_state(
    model: nn.Module,
    optimizer: Optimiser,
    scheduler: ReduceOnPlateau,
    best_state: dict[str, torch.Tensor] | None,
    progress: Progress,
) -> dict[str, Any]:
    """Everything a resumed run needs, as plain tensors and Python types (the network's
    pydantic ``config``, from which its family rebuilds it, included)."""
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


@torch.inference_mode()
def network_logits(
    network: nn.Module, features: np.ndarray, batch_size: int = 65_536
) -> np.ndarray:
    """Raw logits (float64) of a network for a 2-D array of raw features, in batches on the
    network's device."""
    device = next(network.parameters()).device
    out = np.empty(len(features), dtype=np.float64)
    for start in range(0, len(features), batch_size):
        chunk = torch.as_tensor(
            np.ascontiguousarray(features[start : start + batch_size], dtype=np.float32),
            device=device,
        )
        out[start : start + len(chunk)] = network(chunk).float().cpu().numpy()
    return out


def evaluate(model: nn.Module, data: SnapshotStream, split: str) -> dict[str, float]:
    """Log loss and ROC AUC of the network's raw sigmoid on ``split`` (what an epoch is judged
    and logged by), streamed chunk by chunk (as during training, before a calibration is
    fitted)."""
    ys, ps = [], []
    was_training = model.training
    model.eval()
    for x, y in data.chunks(split, copy=False):
        ys.append(y)
        ps.append(sigmoid(network_logits(model, x)))
    model.train(was_training)
    labels, probabilities = np.concatenate(ys), np.concatenate(ps)
    return {"logloss": log_loss(labels, probabilities), "auc": roc_auc(labels, probabilities)}


def train_model(
    model: nn.Module,
    data: SnapshotStream,
    settings: TrainingSettings,
    device: torch.device,
    *,
    learning_rate: float | None = None,
    warmup_steps: int = 0,
    ctx: DistContext | None = None,
    resume: dict[str, Any] | None = None,
    save: SaveFn | None = None,
    policy: CheckpointPolicy | None = None,
    stop_after_steps: int | None = None,
    compile_model: bool = False,
) -> TrainOutcome:
    """Mini-batch AdamW on BCE loss with early stopping; the learning rate rises linearly to
    ``learning_rate`` over the first ``warmup_steps`` steps; checkpoints through ``save``
    (rank 0) when ``policy`` says so; ``resume`` continues from a checkpoint state."""
    loop = _TrainingLoop(
        model, data, settings, device, learning_rate, ctx or DistContext(), save, policy
    )
    loop.warmup_steps = warmup_steps
    if resume is not None:
        loop.restore(resume)
    loop.wrap(compile_model)
    while not loop.progress.finished:
        if not loop.run_epoch(stop_after_steps):
            return loop.outcome  # stopped on purpose, with a checkpoint to resume from
        loop.end_epoch()
    return loop.finish()


def check_resume(
    model: nn.Module,
    data: SnapshotStream,
    settings: TrainingSettings,
    device: torch.device,
    state: dict[str, Any],
    *,
    learning_rate: float | None = None,
    ctx: DistContext | None = None,
) -> None:
    """Raise (KeyError, RuntimeError, ValueError, TypeError) when ``state`` cannot continue the
    training of ``model``: the restore :func:`train_model` would do, tried on a throwaway
    optimiser and scheduler (the global RNG is left as it was), and the best weights' shapes."""
    with torch.random.fork_rng(devices=[]):
        loop = _TrainingLoop(
            model, data, settings, device, learning_rate, ctx or DistContext(), None, None
        )
        loop.restore(state)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    best = loop.best_state
    if best is not None and {k: tuple(v.shape) for k, v in best.items()} != shapes:
        raise ValueError("its best weights do not fit the network")


class _TrainingLoop:
    """The state of one training run: model, optimiser, scheduler, best weights, position."""

    def __init__(
        self,
        model: nn.Module,
        data: SnapshotStream,
        settings: TrainingSettings,
        device: torch.device,
        learning_rate: float | None,
        ctx: DistContext,
        save: SaveFn | None,
        policy: CheckpointPolicy | None,
    ) -> None:
        self.started = time.perf_counter()
        self.data, self.settings, self.device, self.ctx = data, settings, device, ctx
        self.save, self.policy = save, policy
        self.model = model.to(device)
        self.optimizer = loop_optimizer(
            self.model.parameters(),
            lr=learning_rate or settings.learning_rate,
            weight_decay=settings.weight_decay,
            device=device,
        )
        self.scheduler = ReduceOnPlateau(self.optimizer, factor=0.5, patience=1)
        self.progress = Progress()
        self.best_state: dict[str, torch.Tensor] | None = None
        torch.manual_seed(settings.seed + ctx.rank)  # dropout masks differ per rank
        self.outcome = TrainOutcome(model=self.model, progress=self.progress, history=[])
        self.net: nn.Module = self.model
        self.eager: nn.Module = self.model
        self.loss_fn = nn.BCEWithLogitsLoss()
        self.peak_lr = learning_rate or settings.learning_rate
        self.warmup_steps = 0

    def restore(self, resume: dict[str, Any]) -> None:
        """Continue exactly where a checkpoint state left off (weights, optimiser, RNG, data)."""
        self.model.load_state_dict(resume["model"])
        self.optimizer.load_state_dict(resume["optimizer"])
        self.scheduler.load_state_dict(resume["scheduler"])
        self.best_state = resume["best_model"] or None
        saved = resume["progress"]  # copied: the epochs run now are not added to the checkpoint's
        self.progress = Progress(**saved | {"history": list(saved.get("history", ()))})
        if self.ctx.distributed:
            torch.manual_seed(self.settings.seed + self.ctx.rank + 7919 * self.progress.step)
        else:
            torch.set_rng_state(resume["rng_torch"])
            if self.device.type == "cuda" and resume["rng_cuda"]:
                torch.cuda.set_rng_state_all(resume["rng_cuda"])
        self.outcome = TrainOutcome(
            model=self.model,
            progress=self.progress,
            history=[EpochRecord(**h) for h in self.progress.history],
            resumed_from_step=self.progress.step,
        )

    def wrap(self, compile_model: bool) -> None:
        """DDP across ranks, then ``torch.compile`` when asked."""
        if self.ctx.distributed:
            from torch.nn.parallel import DistributedDataParallel

            cuda = self.device.type == "cuda"
            self.net = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if cuda else None
            )
        self.eager = self.net
        if compile_model:
            self.net = torch.compile(self.net)

    def checkpoint(self) -> None:
        """Hand the full training state to ``save`` (rank 0) and tell the policy."""
        if self.save is not None and self.ctx.is_main:
            state = training_state(
                self.model, self.optimizer, self.scheduler, self.best_state, self.progress
            )
            self.save(state, self.progress)
            self.outcome.checkpoints_written += 1
        if self.policy is not None:
            self.policy.mark(self.progress.step)

    def run_epoch(self, stop_after_steps: int | None) -> bool:
        """One pass over this rank's share of the train split (from the saved position);
        False when ``stop_after_steps`` stopped it."""
        progress, ctx = self.progress, self.ctx
        self.epoch_started = time.perf_counter()
        self.net.train()
        self.loss_sum = torch.zeros((), device=self.device)
        self.n_batches = 0
        for g, xb, yb in self.data.minibatches(
            seed=self.settings.seed,
            epoch=progress.epoch,
            batch_size=self.settings.batch_size,
            start=progress.batch,
            rank=ctx.rank,
            world_size=ctx.world_size,
            pin_memory=self.device.type == "cuda",
        ):
            self.step(xb, yb)
            progress.step += 1
            progress.samples += len(yb) * ctx.world_size
            progress.batch = g - ctx.rank + ctx.world_size
            self.outcome.steps_this_run += 1
            if self.policy is not None and self.policy.due(progress.step):
                self.checkpoint()
            if stop_after_steps and self.outcome.steps_this_run >= stop_after_steps:
                if self.policy is None or self.policy.last_step_saved != progress.step:
                    self.checkpoint()
                self.outcome.interrupted = True
                self.outcome.seconds = time.perf_counter() - self.started
                log.info(
                    "stopping after %d steps this run (step %d)", stop_after_steps, progress.step
                )
                return False
        return True

    def step(self, xb: torch.Tensor, yb: torch.Tensor) -> None:
        """One optimiser step (bf16 autocast on CUDA; a failing compiled graph falls back)."""
        xb = xb.to(self.device, non_blocking=True)
        yb = yb.to(self.device, non_blocking=True)
        on_cuda = self.device.type == "cuda"
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=on_cuda):
            try:
                logits = self.net(xb)
            except Exception as exc:  # a compile backend failing on this machine's toolchain
                if self.net is self.eager:
                    raise
                log.warning("torch.compile failed (%s); continuing without it", exc)
                self.net = self.eager
                logits = self.net(xb)
            loss = self.loss_fn(logits.float(), yb)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.progress.step < self.warmup_steps:  # a function of the step: resumes exactly
            for group in self.optimizer.param_groups:
                group["lr"] = self.peak_lr * (self.progress.step + 1) / self.warmup_steps
        self.optimizer.step()
        self.loss_sum += loss.detach()
        self.n_batches += 1

    def end_epoch(self) -> None:
        """Validate, schedule the learning rate, keep the best weights, decide to stop."""
        progress, ctx, epoch = self.progress, self.ctx, self.progress.epoch
        self.model.eval()
        val = evaluate(self.model, self.data, "val")
        val["logloss"], val["auc"] = ctx.broadcast_from_main(
            [val["logloss"], val["auc"]], self.device
        )
        self.scheduler.step(val["logloss"])
        record = EpochRecord(
            epoch=epoch,
            train_loss=float(self.loss_sum) / max(self.n_batches, 1),
            val_logloss=val["logloss"],
            val_auc=val["auc"],
            seconds=time.perf_counter() - self.epoch_started,
            learning_rate=float(self.optimizer.param_groups[0]["lr"]),
        )
        self.outcome.history.append(record)
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
            self.best_state = {
                k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()
            }
        else:
            progress.stale += 1
        progress.epoch, progress.batch = epoch + 1, 0
        if progress.stale >= self.settings.patience or epoch >= self.settings.max_epochs:
            if ctx.is_main and progress.stale >= self.settings.patience:
                log.info("early stop after epoch %d (best epoch %d)", epoch, progress.best_epoch)
            progress.finished = True
            self.checkpoint()

    def finish(self) -> TrainOutcome:
        """The best weights (by validation log loss) in eval mode."""
        if self.best_state is not None:
            self.model.load_state_dict(self.best_state)
        self.model.eval()
        self.outcome.seconds = time.perf_counter() - self.started
        return self.outcome
