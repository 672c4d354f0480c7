"""Flow ``pipeline``: validate -> features -> preprocess -> train -> batch inference.

Orchestration only. Each stage is its own flow (a subflow here, so the UI shows the tree) and
reads what the previous one published in the store, never in-memory objects.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Literal

from prefect import flow
from pydantic import BaseModel, Field

from flows._glue import publish_cost_table, publish_plan_table, resolve_run_id, stage_context
from flows.batch_inference import InferenceParams, batch_inference_flow
from flows.features import FeaturesParams, features_flow
from flows.preprocess import PreprocessParams, preprocess_flow
from flows.train import TrainParams, train_flow
from flows.validate import ValidateParams, validate_flow
from tasks.input_formats import InputOptions
from tasks.run_accounting import account_run, embedded_pool, peak_memory_mb, plan_pipeline
from tasks.stage_records import PipelineSummary


class PipelineParams(BaseModel):
    """Parameters of a whole pipeline run."""

    events: str = Field(description="Parquet/CSV file or folder of events")
    as_of: dt.date | None = Field(default=None, description="T (default: last event's date)")
    horizon_days: int | None = Field(default=None, ge=1, le=3650)
    max_bad_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    device: Literal["auto", "cuda", "cpu"] = "auto"
    input: InputOptions = Field(default_factory=InputOptions, description="how to read events")
    use_cache: bool | None = Field(default=None, description="False: recompute CPU stages")
    store: str | None = Field(default=None, description="default: HYBRIDFLOW_STORE")
    deadline: str | None = Field(default=None, description="pipeline deadline, e.g. 2h")
    pinned_pools: dict[str, str] = Field(
        default_factory=dict, description="stage -> pool, always wins over the router"
    )
    tight_budget: bool = Field(default=False, description="CPU first where rules decide")
    fresh_training: bool = Field(default=False, description="ignore the training's checkpoints")


@flow(name="pipeline")
def pipeline_flow(params: PipelineParams) -> PipelineSummary:
    """The whole DAG in this process (embedded mode)."""
    started = time.perf_counter()
    run_id = resolve_run_id(None)
    store = params.store
    settings, store_obj = stage_context(store)
    plan = plan_pipeline(
        params.events,
        settings,
        store_obj,
        deadline=params.deadline,
        pinned=params.pinned_pools,
        tight_budget=params.tight_budget,
    )
    publish_plan_table(plan)
    device = params.device
    if device == "auto" and plan.pool_for("train") == "cpu-pool":
        device = "cpu"  # the router decided training is cheaper on CPU
    validated = validate_flow(
        ValidateParams(
            events=params.events,
            run_id=run_id,
            max_bad_fraction=params.max_bad_fraction,
            input=params.input,
            use_cache=params.use_cache,
            store=store,
        )
    )
    features = features_flow(
        FeaturesParams(
            run_id=run_id,
            as_of=params.as_of,
            horizon_days=params.horizon_days,
            use_cache=params.use_cache,
            store=store,
        )
    )
    prepared = preprocess_flow(
        PreprocessParams(run_id=run_id, use_cache=params.use_cache, store=store)
    )
    trained = train_flow(
        TrainParams(run_id=run_id, device=device, store=store, fresh=params.fresh_training)
    )
    scored = batch_inference_flow(InferenceParams(as_of=features.as_of, run_id=run_id, store=store))
    stages = [validated.report, features.report, prepared.report, trained.report, scored.report]
    for report in stages:
        report.pool = embedded_pool(report.device)
        report.peak_memory_mb = peak_memory_mb()
    cost = account_run(store_obj, settings, run_id, stages)
    publish_cost_table(cost)
    return PipelineSummary(
        status="completed",
        flow_run_id=run_id,
        run_id=run_id,
        as_of=features.as_of,
        horizon_days=features.horizon_days,
        model_version=trained.model_version,
        promoted=trained.promoted,
        promotion_reason=trained.decision_reason,
        scored_with=scored.model_version,
        metrics={
            "test_auc": trained.metrics["auc"],
            "test_pr_auc": trained.metrics["pr_auc"],
            "test_logloss": trained.metrics["logloss"],
            "n_train": trained.n_train,
            "n_test": trained.n_test,
        },
        predictions_uri=scored.predictions_uri,
        quarantine_uri=validated.quarantine_uri,
        rows_read=validated.rows_read,
        rows_quarantined=validated.rows_quarantined,
        quarantine_reasons=validated.quarantine_reasons,
        rows_scored=scored.rows_scored,
        stages=stages,
        seconds=time.perf_counter() - started,
        plan=[{"stage": d.stage, "pool": d.pool, "reason": d.reason} for d in plan.decisions],
        cost=cost.model_dump(mode="json"),
    )
