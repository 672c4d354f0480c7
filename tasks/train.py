"""Training the purchase model in plain PyTorch: early stopping on validation log loss.

Input is a feature snapshot in local Parquet files (``split=train|val|test`` folders);
nothing here knows about Prefect or the store.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.dataset as pads
import torch
from torch import nn

from infra.settings import TrainingSettings
from tasks.metrics import classification_metrics
from tasks.model import CustomerMLP, ModelConfig, predict_proba
from tasks.preprocess import Normalizer

log = logging.getLogger(__name__)


@dataclass
class SplitArrays:
    """Features (float32, ``features`` order), labels (float32) and ids of one split."""

    x: np.ndarray
    y: np.ndarray
    customer_ids: np.ndarray


def load_split(snapshot_dir: Path, split: str, features: list[str]) -> SplitArrays:
    """Read one split of a snapshot into arrays."""
    path = Path(snapshot_dir) / f"split={split}"
    if not path.exists():
        raise FileNotFoundError(f"snapshot split {split!r} missing at {path}")
    table = pads.dataset(str(path), format="parquet").to_table(
        columns=["customer_id", "label", *features]
    )
    x = np.column_stack([table.column(f).to_numpy().astype(np.float32) for f in features])
    return SplitArrays(
        x=x,
        y=table.column("label").to_numpy().astype(np.float32),
        customer_ids=table.column("customer_id").to_numpy(zero_copy_only=False),
    )


@dataclass
class EpochRecord:
    """Metrics of one epoch."""

    epoch: int
    train_loss: float
    val_logloss: float
    val_auc: float
    seconds: float


@dataclass
class TrainOutcome:
    """The best model (by validation log loss) and how training went."""

    model: CustomerMLP
    history: list[EpochRecord] = field(default_factory=list)
    best_epoch: int = 0
    steps: int = 0
    samples_seen: int = 0
    seconds: float = 0.0


def build_model(normalizer: Normalizer, settings: TrainingSettings) -> CustomerMLP:
    """A fresh model for the snapshot's features and normaliser."""
    return CustomerMLP(
        ModelConfig(
            features=normalizer.features,
            hidden_sizes=settings.hidden_sizes,
            dropout=settings.dropout,
            norm_mean=normalizer.mean,
            norm_std=normalizer.std,
        )
    )


def train_model(
    model: CustomerMLP,
    train: SplitArrays,
    val: SplitArrays,
    settings: TrainingSettings,
    device: torch.device,
    learning_rate: float | None = None,
) -> TrainOutcome:
    """Mini-batch AdamW on BCE loss; keeps the weights of the best validation epoch."""
    torch.manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    model = model.to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=learning_rate or settings.learning_rate,
        weight_decay=settings.weight_decay,
    )
    loss_fn = nn.BCEWithLogitsLoss()
    x_all = torch.from_numpy(train.x)
    y_all = torch.from_numpy(train.y)
    if device.type == "cuda":
        x_all, y_all = x_all.pin_memory(), y_all.pin_memory()
    outcome = TrainOutcome(model=model)
    best_loss, best_state, stale = math.inf, None, 0
    started = time.perf_counter()
    for epoch in range(1, settings.max_epochs + 1):
        t0 = time.perf_counter()
        model.train()
        order = torch.from_numpy(rng.permutation(len(train.y)))
        total, batches = 0.0, 0
        for start in range(0, len(order), settings.batch_size):
            idx = order[start : start + settings.batch_size]
            xb = x_all[idx].to(device, non_blocking=True)
            yb = y_all[idx].to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                loss = loss_fn(model(xb).float(), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            batches += 1
            outcome.steps += 1
            outcome.samples_seen += len(idx)
        model.eval()
        val_metrics = classification_metrics(val.y, predict_proba(model, val.x))
        record = EpochRecord(
            epoch=epoch,
            train_loss=total / max(batches, 1),
            val_logloss=val_metrics["logloss"],
            val_auc=val_metrics["auc"],
            seconds=time.perf_counter() - t0,
        )
        outcome.history.append(record)
        log.info(
            "epoch %d: train loss %.4f, val logloss %.4f, val AUC %.4f (%.1fs)",
            epoch,
            record.train_loss,
            record.val_logloss,
            record.val_auc,
            record.seconds,
        )
        if record.val_logloss < best_loss - 1e-5:
            best_loss, stale, outcome.best_epoch = record.val_logloss, 0, epoch
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            stale += 1
            if stale >= settings.patience:
                log.info("early stop after epoch %d (best epoch %d)", epoch, outcome.best_epoch)
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    outcome.seconds = time.perf_counter() - started
    return outcome


def evaluate(model: CustomerMLP, split: SplitArrays) -> dict[str, float]:
    """Test metrics of ``model`` on ``split``."""
    return classification_metrics(split.y, predict_proba(model, split.x))
