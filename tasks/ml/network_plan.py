"""How a network fit uses the machine at the size of its data: the mini-batch, the learning rate
and its warm-up, and the CPU threads, decided once per fit from the example count, the network's
size and the cores the stage owns.

Measured on a 2-core box (an MLP of 5,121 parameters, shared with other work): one torch thread
steps 1,024-row batches at 135-195k samples/s, two threads at 10-14k (OpenMP workers spinning
on a busy core); at 16,384 rows per batch two threads beat one (377-403k against 330-345k
samples/s) and at 32,768 by 1.45x. So a batch grows with the example count (it doubles with
each doubling of the training rows beyond :data:`SCALE_FROM_ROWS`: 1,024 below 131,072 rows,
16,384 from 1,048,576), and threads are added only when each gets at least
:data:`STEP_FLOPS_PER_THREAD` of a step's work. A larger batch
takes a learning rate larger by the square root of the growth (the rule for Adam-type
optimisers), reached by a linear warm-up over the first steps. At the base batch nothing changes:
the same steps, rate and thread count as a fit with scaling off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infra.compute.devices import available_cores
from infra.settings import TrainingSettings

SCALE_FROM_ROWS = 65_536  # the batch doubles with each doubling of the training rows beyond
STEP_FLOPS_PER_THREAD = 200e6  # forward + backward FLOPs of one step that one thread must get
WARMUP_STEPS = 50


@dataclass(frozen=True)
class NetworkPlan:
    """The batch, learning rate, warm-up and threads of one network fit."""

    batch_size: int
    learning_rate: float
    warmup_steps: int
    threads: int

    def describe(self, cpu: bool = True) -> str:
        warmup = f", warm-up {self.warmup_steps} steps" if self.warmup_steps else ""
        threads = f", {self.threads} torch threads per process on CPU" if cpu else ""
        return f"batch {self.batch_size}, learning rate {self.learning_rate:.3g}{warmup}{threads}"


def scaled_batch_size(rows: int, base: int, largest: int) -> int:
    """The base batch doubled with every doubling of ``rows`` beyond :data:`SCALE_FROM_ROWS`
    (so an epoch keeps at least ``SCALE_FROM_ROWS / base`` steps), at most ``largest``."""
    batch = base
    while batch * 2 <= largest and rows >= SCALE_FROM_ROWS * (batch * 2 // base):
        batch *= 2
    return batch


def threads_for_step(step_flops: float, cores: int) -> int:
    """One thread per :data:`STEP_FLOPS_PER_THREAD` of a step's work, at most ``cores``."""
    return max(1, min(cores, int(step_flops // STEP_FLOPS_PER_THREAD)))


def network_plan(
    settings: TrainingSettings,
    *,
    train_rows: int,
    parameters: int,
    learning_rate: float,
    processes: int = 1,
    cores: int | None = None,
    chunk_rows: int | None = None,
) -> NetworkPlan:
    """The plan for fitting a network of ``parameters`` on ``train_rows`` rows shared among
    ``processes`` ranks on ``cores`` cores (default: this process's), starting from
    ``learning_rate``. ``HYBRIDFLOW_TRAIN__THREADS`` fixes the threads; a largest batch equal
    to the base batch turns scaling off."""
    largest = max(settings.batch_size, settings.max_batch_size)
    if chunk_rows:
        largest = min(largest, max(settings.batch_size, chunk_rows))  # batches cut from a chunk
    per_rank = train_rows // max(1, processes)
    batch = scaled_batch_size(per_rank, settings.batch_size, largest)
    growth = batch / settings.batch_size
    own_cores = max(1, (cores or available_cores()) // max(1, processes))
    threads = settings.threads or threads_for_step(6.0 * parameters * batch, own_cores)
    return NetworkPlan(
        batch_size=batch,
        learning_rate=learning_rate * math.sqrt(growth),
        warmup_steps=WARMUP_STEPS if growth > 1 else 0,
        threads=threads,
    )
