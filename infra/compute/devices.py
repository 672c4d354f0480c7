"""Device detection and per-device torch settings for the training and scoring stages."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: the flows' import chain stays torch-free
    import torch

log = logging.getLogger(__name__)


def select_device(prefer: str = "auto", local_rank: int = 0) -> torch.device:
    """``cuda`` (the local rank's GPU) when available, else ``cpu`` with a logged warning."""
    import torch

    if prefer not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device must be auto, cuda or cpu, not {prefer!r}")
    if prefer != "cpu" and torch.cuda.is_available():
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if prefer != "cpu":
        log.warning("no CUDA device found: training runs on CPU (same code path, slower)")
    return torch.device("cpu")


def available_cores() -> int:
    """CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def configure_accelerator(device: torch.device) -> None:
    """TF32 matmuls and cuDNN autotuning on CUDA; nothing to do on CPU."""
    if device.type == "cuda":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
        torch.set_float32_matmul_precision("high")
