"""Shared Prefect glue for the stage flows: run ids, the store, stage artifacts."""

from __future__ import annotations

import os
import uuid
from functools import lru_cache

from prefect.artifacts import create_link_artifact, create_table_artifact
from prefect.context import FlowRunContext
from prefect.runtime import flow_run

from infra.costs import CostReport
from infra.planning import RoutingPlan
from infra.settings import HybridflowSettings, get_settings
from infra.store import ObjectStore, open_store
from tasks.stage_records import PipelineSummary, StageReport

POOL_BY_STAGE = {
    "validate": "cpu-pool",
    "features": "cpu-pool",
    "preprocess": "cpu-pool",
    "train": "gpu-pool",
    "batch_inference": "cpu-pool",
}


def stage_context(store_uri: str | None) -> tuple[HybridflowSettings, ObjectStore]:
    """Settings and the store (a parameter overrides ``HYBRIDFLOW_STORE``)."""
    settings = get_settings()
    return settings, open_store(store_uri or settings.store)


def resolve_run_id(explicit: str | None) -> str:
    """The pipeline run id handed down, else this flow run's id."""
    if explicit:
        return explicit
    current = flow_run.get_id()
    return str(current) if current else uuid.uuid4().hex


@lru_cache(maxsize=1)
def _process_flow_run_pool(flow_run_id: str) -> str | None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(uuid.UUID(flow_run_id)).work_pool_name


def current_pool(default: str = "embedded") -> str:
    """The work pool running this flow: its own run's pool, else (an in-process subflow) the pool
    of the deployment run that started this process, else ``default``."""
    ctx = FlowRunContext.get()
    if ctx and ctx.flow_run and ctx.flow_run.work_pool_name:
        return ctx.flow_run.work_pool_name
    if os.environ.get("HYBRIDFLOW_POOL"):
        return os.environ["HYBRIDFLOW_POOL"]
    process_run = os.environ.get("PREFECT__FLOW_RUN_ID")
    return (_process_flow_run_pool(process_run) if process_run else None) or default


def publish_stage_table(report: StageReport, **extra: object) -> None:
    """A table artifact with the stage's figures (rows, seconds, device, pool, cached)."""
    row = report.model_dump() | {"pool": current_pool(report.pool)} | dict(extra)
    create_table_artifact(
        table=[{"metric": k, "value": str(v)} for k, v in row.items()],
        key=f"stage-{report.name.replace('_', '-')}",
        description=f"{report.name}: {report.seconds:.1f}s on {report.device}",
    )


def publish_plan_table(plan: RoutingPlan) -> None:
    """The routing plan as a table artifact: stage, pool, alternative, basis, reason."""
    create_table_artifact(
        table=[
            {
                "stage": d.stage,
                "pool": d.pool,
                "alternative": d.alternative or "-",
                "basis": d.basis,
                "reason": d.reason,
            }
            for d in plan.decisions
        ],
        key="routing-plan",
        description="where each stage runs and why",
    )


def publish_cost_table(cost: CostReport) -> None:
    """Per-stage cost, total and the all-CPU / all-GPU alternatives as a table artifact."""
    rows = [
        {
            "stage": c.stage,
            "pool": c.pool,
            "seconds": round(c.seconds, 2),
            "usd": round(c.cost_usd, 6),
        }
        for c in cost.stages
    ]
    rows += [
        {
            "stage": "TOTAL",
            "pool": "-",
            "seconds": round(sum(c.seconds for c in cost.stages), 2),
            "usd": round(cost.total_usd, 6),
        },
        {
            "stage": "all-cpu alternative",
            "pool": "cpu",
            "seconds": "-",
            "usd": round(cost.all_cpu_usd, 6),
        },
        {
            "stage": "all-gpu alternative",
            "pool": "gpu",
            "seconds": "-",
            "usd": round(cost.all_gpu_usd, 6),
        },
    ]
    create_table_artifact(table=rows, key="run-cost", description=f"run cost ({cost.basis})")


def publish_pipeline_artifacts(summary: PipelineSummary, model_uri: str) -> None:
    """One row per stage (where it ran, how long, reused or not) and links to the outputs."""
    create_table_artifact(
        table=[
            {
                "stage": r.name,
                "pool": r.pool,
                "device": r.device,
                "seconds": round(r.seconds, 1),
                "rows_in": r.rows_in,
                "rows_out": r.rows_out,
                "cached": r.cached,
            }
            for r in summary.stages
        ],
        key="pipeline-stages",
        description=f"run {summary.run_id}: model {summary.model_version}, "
        f"{summary.rows_scored:,} customers scored",
    )
    create_link_artifact(
        key="pipeline-predictions",
        link=summary.predictions_uri,
        description=f"predictions as of {summary.as_of}",
    )
    create_link_artifact(
        key="pipeline-model-version",
        link=model_uri,
        description=f"model {summary.model_version} "
        f"({'promoted' if summary.promoted else 'not promoted'})",
    )
