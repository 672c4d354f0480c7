"""Shared Prefect glue for the stage flows: run ids, the store, stage artifacts."""

from __future__ import annotations

import uuid

from prefect.artifacts import create_table_artifact
from prefect.runtime import flow_run

from infra.settings import HybridflowSettings, get_settings
from infra.store import ObjectStore, open_store
from tasks.stage_records import StageReport

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


def publish_stage_table(report: StageReport, **extra: object) -> None:
    """A table artifact with the stage's figures (rows, seconds, device, pool, cached)."""
    row = report.model_dump() | {k: v for k, v in extra.items()}
    create_table_artifact(
        table=[{"metric": k, "value": str(v)} for k, v in row.items()],
        key=f"stage-{report.name.replace('_', '-')}",
        description=f"{report.name}: {report.seconds:.1f}s on {report.device}",
    )
