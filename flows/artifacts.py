"""Every Prefect artifact the flows publish: what a person reads in the UI after a run."""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any
from uuid import UUID

from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.context import FlowRunContext, TaskRunContext

from infra.routing.costs import CostReport
from infra.routing.planner import RoutingPlan
from infra.storage.registry import ModelManifest
from tasks.reporting.model_card import model_card_markdown
from tasks.reporting.records import (
    FeaturesResult,
    InferenceResult,
    PipelineSummary,
    StageReport,
    ValidateResult,
)

if TYPE_CHECKING:  # torch stays out of the CPU stages' processes
    from tasks.data.drift_records import DriftReport
    from tasks.policy.refresh import RefreshResult
    from tasks.stages.train import TrainStageOutput

log = logging.getLogger(__name__)


def progress_artifact_key(name: str) -> str:
    """Key of a stage's progress artifact (Prefect keys: lower-case letters, digits, dashes)."""
    return "progress-" + re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")


class ProgressArtifact:
    """A :class:`infra.progress.ProgressSink` that keeps one Prefect progress artifact
    of the current run up to date. The artifact is created here, in the run's context (updates
    may come from a polling thread); a failure to reach the API is logged once and never raised
    (progress must not fail the stage)."""

    def __init__(self, name: str) -> None:
        self.key = progress_artifact_key(name)
        self.log_extra: dict[str, Any] = _run_ids()
        self._artifact_id: UUID | None = None
        if self.log_extra:  # outside a run there is nothing to attach it to
            try:
                self._artifact_id = create_progress_artifact(
                    progress=0.0, key=self.key, description=f"{name}: starting"
                )
            except Exception as exc:  # noqa: BLE001 - a side channel
                log.warning("progress artifact %s not created: %s", self.key, exc)

    def __call__(self, percent: float, description: str) -> None:
        if self._artifact_id is None:
            return
        try:
            update_progress_artifact(
                artifact_id=self._artifact_id, progress=percent, description=description
            )
        except Exception as exc:  # noqa: BLE001 - a side channel
            self._artifact_id = None
            log.warning("progress artifact %s not updated: %s", self.key, exc)


def _run_ids() -> dict[str, Any]:
    """The current flow/task run ids, so that log lines from a polling thread reach the run."""
    ids: dict[str, Any] = {}
    flow_ctx = FlowRunContext.get()
    if flow_ctx is not None and flow_ctx.flow_run is not None:
        ids["flow_run_id"] = flow_ctx.flow_run.id
    task_ctx = TaskRunContext.get()
    if task_ctx is not None:
        ids["task_run_id"] = task_ctx.task_run.id
    return ids


def publish_stage_table(report: StageReport, **extra: object) -> None:
    """A table artifact with the stage's figures (rows, seconds, device, pool, cached)."""
    row = report.model_dump() | dict(extra)
    create_table_artifact(
        table=[{"metric": k, "value": str(v)} for k, v in row.items()],
        key=f"stage-{report.name.replace('_', '-')}",
        description=f"{report.name}: {report.seconds:.1f}s on {report.device}",
    )


def publish_quarantine_table(result: ValidateResult) -> None:
    """The quarantined rows per reason (published also when the run then fails)."""
    rows = [
        {"reason": reason, "rows": count, "share": f"{count / max(result.rows_read, 1):.4%}"}
        for reason, count in sorted(result.quarantine_reasons.items())
    ]
    create_table_artifact(
        table=rows or [{"reason": "(none)", "rows": 0, "share": "0%"}],
        key="quarantine",
        description=f"{result.rows_quarantined} of {result.rows_read} rows quarantined: "
        f"{result.quarantine_uri}",
    )


def publish_training_artifacts(
    output: TrainStageOutput,
    manifest: ModelManifest,
    versions_uri: str,
    *,
    features: FeaturesResult,
    **_other_upstream: object,
) -> None:
    """The per-epoch table and the model card of a trained version (the train stage's upstream
    results are passed as they were to its runner; the card needs ``features``)."""
    if output.history:
        create_table_artifact(
            table=[vars(e) for e in output.history],
            key="train-epochs",
            description="per-epoch metrics",
        )
    create_markdown_artifact(
        markdown=model_card_markdown(
            output.result, output.decision, features, manifest, versions_uri
        ),
        key="model-card",
        description=f"model {output.result.model_version}",
    )


def publish_predictions_link(result: InferenceResult, as_of: object) -> None:
    """A link to the published predictions."""
    create_link_artifact(
        key="predictions", link=result.predictions_uri, description=f"predictions {as_of}"
    )


def publish_refresh_table(result: RefreshResult) -> None:
    """What a refresh did and why, one row per item."""
    create_table_artifact(
        table=[
            {"item": k, "value": str(v)}
            for k, v in result.model_dump(exclude={"stages", "metrics"}).items()
        ],
        key="model-refresh",
        description=f"refresh as_of {result.as_of}: {result.reason}",
    )


def drift_table_rows(report: DriftReport) -> list[dict[str, object]]:
    """The drift table: feature, measure, value, threshold, status (drifted rows first)."""
    order = {"drift": 0, "ok": 1, "ignored": 2, "n/a": 3}
    return [
        {
            "feature": r.feature,
            "measure": r.measure,
            "value": None if r.value is None else round(r.value, 4),
            "threshold": r.threshold,
            "status": r.status,
        }
        for r in sorted(report.rows, key=lambda r: (order[r.status], -(r.value or 0.0)))
    ]


def publish_drift_table(report: DriftReport) -> None:
    """The drift check as the table artifact ``drift``."""
    drifted = ", ".join(r.feature for r in report.drifted) or "nothing"
    create_table_artifact(
        table=drift_table_rows(report),
        key="drift",
        description=f"drift at {report.as_of} against {report.model_version}: "
        f"{report.status} ({drifted} above threshold)",
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
