"""Device detection for the torch stages: CUDA when present, else CPU with a warning."""

from __future__ import annotations

import logging
import os

import torch

log = logging.getLogger(__name__)


def select_device(prefer: str = "auto") -> torch.device:
    """``cuda`` when available (or asked for and present), else ``cpu`` with a logged warning."""
    if prefer not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device must be auto, cuda or cpu, not {prefer!r}")
    if prefer != "cpu" and torch.cuda.is_available():
        return torch.device("cuda")
    if prefer != "cpu":
        log.warning("no CUDA device found: training runs on CPU (same code path, slower)")
    return torch.device("cpu")


def configure_cpu_threads(threads: int | None = None) -> int:
    """Use one torch thread per available core unless told otherwise; returns the count."""
    n = threads or len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    n = max(1, threads or n)
    torch.set_num_threads(n)
    return n
