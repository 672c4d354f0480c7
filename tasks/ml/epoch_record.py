"""One epoch's metrics, as training reports them and the stages keep them (no torch: the flows
that carry a history import this, not the training loop)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EpochRecord:
    """Metrics of one epoch."""

    epoch: int
    train_loss: float
    val_logloss: float
    val_auc: float
    seconds: float
    learning_rate: float = 0.0
