"""The work pools hybridflow can route to, with their hardware and hourly prices."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

PoolKind = Literal["cpu", "gpu"]

# the work pools' names: written here and nowhere else (the graph, the router, the stack and the
# cost report import them; prefect.yaml is checked against the graph by a test)
CPU_POOL = "cpu-pool"
GPU_POOL = "gpu-pool"
POOLS: tuple[str, ...] = (CPU_POOL, GPU_POOL)


class PoolSpec(BaseModel):
    """One work pool: what a node has and what it costs per hour."""

    name: str
    kind: PoolKind
    price_per_hour: float = Field(gt=0, description="USD per node-hour used for estimates")
    price_range: tuple[float, float] | None = Field(
        default=None, description="market range, for the plan's notes"
    )
    vcpus: int = Field(default=64, ge=1)
    gpus: int = Field(default=0, ge=0)
    available: bool = True


def default_pools() -> list[PoolSpec]:
    """A 64-vCPU CPU node ($1.50-2.00/h) and one H200 GPU node ($3.50-5.00/h), at midpoints."""
    return [
        PoolSpec(name=CPU_POOL, kind="cpu", price_per_hour=1.75, price_range=(1.50, 2.00)),
        PoolSpec(
            name=GPU_POOL,
            kind="gpu",
            price_per_hour=4.25,
            price_range=(3.50, 5.00),
            vcpus=16,
            gpus=1,
        ),
    ]
