"""The training loop's learning-rate schedule on a plateau of the validation loss, without
``torch.optim`` (whose ``ReduceLROnPlateau`` takes only a ``torch.optim.Optimizer``, which
imports ``torch._dynamo``; see :mod:`tasks.ml.adamw`).

:class:`ReduceOnPlateau` decides as ``torch.optim.lr_scheduler.ReduceLROnPlateau`` with
``mode="min"`` and ``threshold_mode="rel"`` (the loop's): after more than ``patience`` epochs
without a relative improvement of ``threshold`` every group's learning rate is multiplied by
``factor`` (not below ``min_lr``, and not by less than ``eps``), then ``cooldown`` epochs pass
before bad epochs count again. Its ``state_dict`` is torch's, so checkpoints written with torch's
scheduler resume with it, and the other way round.
"""

from __future__ import annotations

import math
from typing import Any, Protocol


class _HasParamGroups(Protocol):
    param_groups: list[dict[str, Any]]


# the fields of torch's ReduceLROnPlateau.state_dict() that this schedule reads back
_STATE_FIELDS = (
    "factor",
    "min_lrs",
    "patience",
    "cooldown",
    "eps",
    "last_epoch",
    "threshold",
    "best",
    "cooldown_counter",
    "num_bad_epochs",
)


class ReduceOnPlateau:
    """Lower the learning rates of ``optimizer`` when the monitored loss stops improving."""

    def __init__(
        self,
        optimizer: _HasParamGroups,
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        cooldown: int = 0,
        min_lr: float = 0.0,
        eps: float = 1e-8,
    ) -> None:
        if not 0 < factor < 1:
            raise ValueError(f"the plateau factor must be in (0, 1), got {factor}")
        self.optimizer = optimizer
        self.factor, self.patience, self.threshold = factor, patience, threshold
        self.cooldown, self.eps = cooldown, eps
        self.default_min_lr: float | None = min_lr
        self.min_lrs = [min_lr] * len(optimizer.param_groups)
        self.last_epoch = 0
        self.best = math.inf
        self.cooldown_counter = 0
        self.num_bad_epochs = 0
        self._last_lr = [group["lr"] for group in optimizer.param_groups]

    def step(self, loss: float) -> None:
        """The end of an epoch whose monitored loss is ``loss``."""
        current = float(loss)
        self.last_epoch += 1
        if current < self.best * (1.0 - self.threshold):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0  # bad epochs in a cooldown do not count
        if self.num_bad_epochs > self.patience:
            self._reduce()
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _reduce(self) -> None:
        groups = self.optimizer.param_groups
        if len(groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise RuntimeError(
                    f"the optimiser has {len(groups)} parameter groups, the schedule's min_lrs "
                    f"{len(self.min_lrs)}"
                )
            self.min_lrs = [self.default_min_lr] * len(groups)
        for group, min_lr in zip(groups, self.min_lrs, strict=True):
            old = float(group["lr"])
            new = max(old * self.factor, min_lr)
            if old - new > self.eps:
                group["lr"] = new

    def get_last_lr(self) -> list[float]:
        """The learning rates after the last :meth:`step`."""
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        """torch's ``ReduceLROnPlateau.state_dict()`` for the same schedule."""
        return {
            "factor": self.factor,
            "default_min_lr": self.default_min_lr,
            "min_lrs": list(self.min_lrs),
            "patience": self.patience,
            "cooldown": self.cooldown,
            "eps": self.eps,
            "last_epoch": self.last_epoch,
            "_last_lr": list(self._last_lr),
            "mode_worse": math.inf,
            "mode": "min",
            "threshold": self.threshold,
            "threshold_mode": "rel",
            "best": self.best,
            "cooldown_counter": self.cooldown_counter,
            "num_bad_epochs": self.num_bad_epochs,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (this class's or torch's ``ReduceLROnPlateau``'s); its
        settings replace these, as torch's loading does. ValueError naming the problem when it is
        not a ``min``/``rel`` plateau schedule's state."""
        missing = [k for k in _STATE_FIELDS if k not in state]
        if missing:
            raise ValueError(f"the scheduler state lacks {missing}: not a plateau schedule's")
        mode = (state.get("mode", "min"), state.get("threshold_mode", "rel"))
        if mode != ("min", "rel"):
            raise ValueError(
                f"the scheduler state is a plateau schedule in mode {mode[0]!r} with threshold "
                f"mode {mode[1]!r}; the training loop's is 'min' with 'rel'"
            )
        for k in _STATE_FIELDS:
            setattr(self, k, state[k])
        self.min_lrs = list(self.min_lrs)
        self.default_min_lr = state.get("default_min_lr", self.default_min_lr)
        self._last_lr = list(state.get("_last_lr", self._last_lr))
