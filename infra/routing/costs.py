"""Cost reports: what each stage cost on its pool, and what all-CPU / all-GPU would have cost.

Alternatives are estimated "by the same model": the router's throughput model for that
(stage, pool) when profiles exist, else the stage's measured seconds scaled by the documented
relative-speed assumptions in :data:`ASSUMED_GPU_SPEEDUP`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, Field

from infra.layout import COSTS, cost_report_day, cost_report_key
from infra.routing.pools import PoolSpec
from infra.routing.profiles import ThroughputModel
from infra.routing.router import WorkloadKind
from infra.storage.store import ObjectStore

# How much faster a GPU node runs a stage than a CPU node, when nothing was measured.
ASSUMED_GPU_SPEEDUP: dict[WorkloadKind, float] = {
    WorkloadKind.FEATURE_ENGINEERING: 0.5,
    WorkloadKind.PREPROCESSING: 0.5,
    WorkloadKind.TRAINING: 10.0,
    WorkloadKind.BATCH_INFERENCE: 1.5,
    WorkloadKind.REALTIME_INFERENCE: 1.0,
}


class StageCost(BaseModel):
    """One stage's cost on the pool it ran on."""

    stage: str
    pool: str
    seconds: float
    price_per_hour: float
    cost_usd: float
    gpu_hours: float


class CostReport(BaseModel):
    """Per-stage costs, the total, and the single-pool alternatives."""

    run_id: str
    created_at: dt.datetime = Field(default_factory=lambda: dt.datetime.now(dt.UTC))
    stages: list[StageCost]
    total_usd: float
    gpu_hours: float
    all_cpu_usd: float
    all_gpu_usd: float
    savings_vs_all_gpu_usd: float
    basis: str = Field(description="how alternatives were estimated")
    kind: Literal["pipeline", "refresh"] = "pipeline"
    refresh: str | None = Field(
        default=None,
        description="pipeline: the refresh its data asked for (drift, new-data) or skipped; "
        "refresh: what started it (drift, new-data, schedule, manual)",
    )


def _seconds_on(
    stage: str,
    kind: WorkloadKind,
    seconds: float,
    ran_on: PoolSpec,
    target: PoolSpec,
    rows: int,
    models: dict[tuple[str, str], ThroughputModel],
) -> tuple[float, bool]:
    if target.name == ran_on.name:
        return seconds, True
    model = models.get((stage, target.name))
    if model is not None:
        return model.seconds_for(rows), True
    speedup = ASSUMED_GPU_SPEEDUP[kind]
    if ran_on.kind == target.kind:
        return seconds, False
    return (seconds / speedup if target.kind == "gpu" else seconds * speedup), False


def cost_report(
    run_id: str,
    stage_runs: list[tuple[str, str, float, int]],
    pools: list[PoolSpec],
    models: dict[tuple[str, str], ThroughputModel] | None = None,
    kinds: Mapping[str, WorkloadKind] | None = None,
) -> CostReport:
    """Cost of ``stage_runs`` = [(stage, pool name, seconds, rows)] and its alternatives
    (estimated from profiles, else from each stage's kind of work, ``kinds``)."""
    models = models or {}
    by_name = {p.name: p for p in pools}
    cpu = next((p for p in pools if p.kind == "cpu"), None)
    gpu = next((p for p in pools if p.kind == "gpu"), None)
    costs: list[StageCost] = []
    all_cpu = all_gpu = 0.0
    measured_all = True
    for stage, pool_name, seconds, rows in stage_runs:
        pool = by_name.get(pool_name)
        if pool is None:
            raise ValueError(f"stage {stage} ran on unknown pool {pool_name!r}")
        costs.append(
            StageCost(
                stage=stage,
                pool=pool.name,
                seconds=seconds,
                price_per_hour=pool.price_per_hour,
                cost_usd=seconds / 3600.0 * pool.price_per_hour,
                gpu_hours=seconds / 3600.0 * pool.gpus if pool.kind == "gpu" else 0.0,
            )
        )
        for target, acc in ((cpu, "cpu"), (gpu, "gpu")):
            if target is None:
                continue
            kind = (kinds or {}).get(stage, WorkloadKind.PREPROCESSING)
            secs, measured = _seconds_on(stage, kind, seconds, pool, target, rows, models)
            measured_all &= measured
            if acc == "cpu":
                all_cpu += secs / 3600.0 * target.price_per_hour
            else:
                all_gpu += secs / 3600.0 * target.price_per_hour
    total = sum(c.cost_usd for c in costs)
    return CostReport(
        run_id=run_id,
        stages=costs,
        total_usd=total,
        gpu_hours=sum(c.gpu_hours for c in costs),
        all_cpu_usd=all_cpu,
        all_gpu_usd=all_gpu,
        savings_vs_all_gpu_usd=all_gpu - total,
        basis="measured profiles"
        if measured_all
        else "profiles where measured, else assumed relative speeds",
    )


def save_cost_report(store: ObjectStore, report: CostReport) -> str:
    """Write the report at ``costs/<date>/<run_id>.json``; returns the key."""
    key = cost_report_key(report.created_at.date(), report.run_id)
    store.put_bytes(key, report.model_dump_json(indent=2).encode())
    return key


def read_cost_reports(store: ObjectStore, since: dt.date | None = None) -> list[CostReport]:
    """Reports newer than ``since`` (inclusive), oldest first."""
    reports = []
    for key in store.list(COSTS):
        day = cost_report_day(key)
        if since is not None and day < since.isoformat():
            continue
        reports.append(CostReport.model_validate_json(store.get_bytes(key)))
    return sorted(reports, key=lambda r: r.created_at)


class RefreshCount(BaseModel):
    """Refreshes run and skipped over a period, against what a fixed schedule would have run."""

    period_start: dt.datetime
    period_end: dt.datetime
    refreshes_run: int
    refreshes_by_trigger: dict[str, int]
    refreshes_skipped: int = Field(description="pipeline runs whose data asked for no refresh")
    gpu_hours: float = Field(description="GPU-hours the refreshes that ran used")
    cost_usd: float
    baseline_interval_hours: float
    baseline_refreshes: int = Field(description="runs of a fixed schedule over the period")
    baseline_gpu_hours: float | None = Field(
        description="their GPU-hours at the measured mean per refresh (None: none measured yet)"
    )
    baseline_cost_usd: float | None


def count_refreshes(
    reports: list[CostReport],
    baseline_interval_hours: float,
    period_start: dt.datetime,
    period_end: dt.datetime,
) -> RefreshCount:
    """Refreshes run (by trigger) and skipped in ``reports``, and the GPU-hours a refresh every
    ``baseline_interval_hours`` would have used from ``period_start`` to ``period_end`` at the
    mean measured cost of the refreshes that ran."""
    refreshes = [r for r in reports if r.kind == "refresh"]
    by_trigger: dict[str, int] = {}
    for r in refreshes:
        by_trigger[r.refresh or "manual"] = by_trigger.get(r.refresh or "manual", 0) + 1
    hours = max((period_end - period_start).total_seconds() / 3600.0, 0.0)
    baseline = int(hours // baseline_interval_hours)
    measured = bool(refreshes)
    mean_gpu = sum(r.gpu_hours for r in refreshes) / len(refreshes) if measured else None
    mean_usd = sum(r.total_usd for r in refreshes) / len(refreshes) if measured else None
    return RefreshCount(
        period_start=period_start,
        period_end=period_end,
        refreshes_run=len(refreshes),
        refreshes_by_trigger=by_trigger,
        refreshes_skipped=sum(
            1 for r in reports if r.kind == "pipeline" and r.refresh == "skipped"
        ),
        gpu_hours=sum(r.gpu_hours for r in refreshes),
        cost_usd=sum(r.total_usd for r in refreshes),
        baseline_interval_hours=baseline_interval_hours,
        baseline_refreshes=baseline,
        baseline_gpu_hours=None if mean_gpu is None else baseline * mean_gpu,
        baseline_cost_usd=None if mean_usd is None else baseline * mean_usd,
    )
