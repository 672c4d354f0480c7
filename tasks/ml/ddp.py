"""Distributed data parallel plumbing: the process group under ``torchrun`` and the launcher.

``torchrun --nproc_per_node=K -m tasks.stages.train_process ...`` starts K processes; each calls
:func:`init_distributed`, which joins the process group (NCCL on GPUs, gloo on CPU) from the
``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` variables torchrun sets. Without those variables the same
code runs as a single process.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from infra.child_processes import die_with_parent
from infra.compute.devices import Device, select_device

if TYPE_CHECKING:  # imported where used: the flows' import chain stays torch-free
    import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0 writes checkpoints, registers and reports."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True inside a multi-process group."""
        return self.world_size > 1

    def barrier(self) -> None:
        """Wait for every rank (no-op for one process)."""
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()

    def broadcast_from_main(self, values: list[float], device: torch.device) -> list[float]:
        """Rank 0's ``values`` on every rank, so all ranks take the same early-stopping step."""
        if not self.distributed:
            return values
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.broadcast(t, src=0)
        return t.tolist()


def init_distributed(device_preference: str = "auto") -> tuple[DistContext, Device]:
    """Join the torchrun process group when there is one; pick this rank's device. A single
    process imports no torch here (:func:`select_device`)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = select_device(device_preference, local_rank)
    ctx = DistContext(rank=rank, world_size=world, local_rank=local_rank)
    if world <= 1:
        return ctx, device
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
        log.info("rank %d/%d joined the %s process group on %s", rank, world, backend, device)
    return ctx, device


def shutdown_distributed() -> None:
    """Leave the process group (if any)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def ddp_command(processes: int, args: list[str]) -> list[str]:
    """The torchrun command line that runs :mod:`tasks.stages.train_process` on ``processes`` devices."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        "-m",
        "tasks.stages.train_process",
        *args,
    ]


def launch_ddp_training(processes: int, args: list[str], result_file: Path) -> None:
    """Run DDP training under torchrun and wait; RuntimeError when it fails."""
    cmd = ddp_command(processes, [*args, "--result-file", str(result_file)])
    log.info("launching DDP training on %d processes: %s", processes, " ".join(cmd))
    # torchrun gets SIGTERM if this process dies (it passes it on to its workers)
    proc = subprocess.run(cmd, check=False, preexec_fn=die_with_parent())
    if proc.returncode != 0 or not result_file.exists():
        raise RuntimeError(f"DDP training failed (torchrun exit code {proc.returncode})")
