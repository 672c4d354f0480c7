"""Device detection and per-device torch settings for the training and scoring stages.

The device travels through a run as :class:`Device`, a plain value: torch is imported by the
fits that need a ``torch.device`` (:meth:`Device.as_torch`), not to choose one. On a machine with
no GPU driver :func:`select_device` answers ``cpu`` without torch, so a run whose fits are all
reused (or need no torch) never imports it.
"""

from __future__ import annotations

import glob
import logging
import os
import sys
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:  # imported where used: the flows' import chain stays torch-free
    import torch

log = logging.getLogger(__name__)

# the device nodes of a GPU driver torch could reach: NVIDIA's, WSL 2's, ROCm's
GPU_DRIVER_NODES = ("/dev/nvidia*", "/dev/dxg", "/dev/kfd")


class Device(BaseModel):
    """Where a stage computes: the CPU or one CUDA device (``str()``: ``cpu`` / ``cuda:0``, as
    ``torch.device`` names it)."""

    model_config = ConfigDict(frozen=True)

    type: Literal["cpu", "cuda"] = "cpu"
    index: int | None = None

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def as_torch(self) -> torch.device:
        """This device as torch names it (imports torch)."""
        import torch

        return torch.device(str(self))


def gpu_driver_present(patterns: tuple[str, ...] = GPU_DRIVER_NODES) -> bool:
    """Whether a GPU driver's device node exists, without which CUDA finds no device (on
    Windows, with no ``/dev`` to look in: True, torch is asked)."""
    if sys.platform == "win32":
        return True
    return any(glob.glob(pattern) for pattern in patterns)


def select_device(prefer: str = "auto", local_rank: int = 0) -> Device:
    """``cuda`` (the local rank's GPU, made torch's current device) when available, else
    ``cpu`` with a logged warning. torch is imported only where a GPU driver is present."""
    if prefer not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device must be auto, cuda or cpu, not {prefer!r}")
    if prefer != "cpu" and gpu_driver_present():
        import torch

        if torch.cuda.is_available():
            index = local_rank % torch.cuda.device_count()
            torch.cuda.set_device(index)
            return Device(type="cuda", index=index)
    if prefer != "cpu":
        log.warning("no CUDA device found: training runs on CPU (same code path, slower)")
    return Device()


def available_cores() -> int:
    """CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def intra_op_threads() -> int:
    """The threads one scoring call may use in this process: torch's setting where torch is
    loaded (a Spark task and the endpoint set it to their share of the cores), else every
    available core (nothing can have lowered torch's setting before torch loads)."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else available_cores()


def configure_accelerator(device: Device) -> None:
    """TF32 matmuls and cuDNN autotuning on CUDA; nothing to do (and no torch) on CPU."""
    if device.type == "cuda":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
        torch.set_float32_matmul_precision("high")
