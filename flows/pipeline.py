"""Flow ``pipeline``: validate -> features -> preprocess -> train -> batch inference.

Orchestration only. Each stage is its own flow (a subflow here, so the UI shows the tree) and
reads what the previous one published in the store, never in-memory objects.

Embedded mode runs the stages in this process. Deployed mode (the default inside a deployment
run) dispatches them to their pools' workers (:mod:`flows.dispatch`) under a run key derived from
the parameters and the events' fingerprint, so a re-run resumes where a failed run stopped.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Literal

from prefect import flow
from pydantic import BaseModel, ConfigDict, Field

from flows._glue import (
    publish_cost_table,
    publish_pipeline_artifacts,
    publish_plan_table,
    resolve_run_id,
    stage_context,
)
from flows.batch_inference import InferenceParams, batch_inference_flow
from flows.dispatch import (
    BATCH_INFERENCE,
    PREPARE,
    TRAIN,
    dispatch_mode,
    run_or_reuse,
    schedule_profiling_runs,
)
from flows.features import FeaturesParams, features_flow
from flows.prepare import PrepareParams
from flows.preprocess import PreprocessParams, preprocess_flow
from flows.train import TrainParams, train_flow
from flows.validate import ValidateParams, validate_flow
from infra.planning import RoutingPlan
from infra.registry import VERSIONS
from infra.settings import HybridflowSettings
from infra.store import ObjectStore
from tasks.input_formats import InputOptions
from tasks.run_accounting import account_run, embedded_pool, peak_memory_mb, plan_pipeline
from tasks.run_key import events_fingerprint, pipeline_run_key
from tasks.stage_records import (
    FeaturesResult,
    InferenceResult,
    PipelineSummary,
    PreprocessResult,
    StageReport,
    TrainResult,
    ValidateResult,
    read_stage_manifest,
)


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
    profile_missing: bool = Field(
        default=False,
        description="deployed: schedule a short profiling run on each pool without profiles",
    )
    mode: Literal["auto", "embedded", "deployed"] = Field(
        default="auto",
        description="deployed: each stage on its pool's worker; auto: deployed in a deployment run",
    )
    run_id: str | None = Field(
        default=None, description="deployed: resume this run key (default: derived from inputs)"
    )
    fresh: bool = Field(
        default=False,
        description="start over: a new run key (deployed) and no training checkpoints",
    )

    model_config = ConfigDict(extra="forbid")

    def output_parameters(self) -> dict[str, object]:
        """The parameters that change a run's outputs (what the run key hashes)."""
        return self.model_dump(
            mode="json",
            exclude={
                "mode",
                "run_id",
                "fresh",
                "deadline",
                "pinned_pools",
                "tight_budget",
                "profile_missing",
            },
        )


@flow(name="pipeline")
def pipeline_flow(params: PipelineParams) -> PipelineSummary:
    """The whole DAG: in this process (embedded) or stage by stage on the pools (deployed)."""
    settings, store = stage_context(params.store)
    plan = _plan(params, settings, store)
    if dispatch_mode(params.mode) == "deployed":
        return _pipeline_deployed(params, settings, store, plan)
    started = time.perf_counter()
    run_id = resolve_run_id(None)
    common = {"run_id": run_id, "store": params.store}
    device = params.device
    if device == "auto" and plan.pool_for("train") == "cpu-pool":
        device = "cpu"  # the router decided training is cheaper on CPU
    validated = validate_flow(
        ValidateParams(
            events=params.events,
            max_bad_fraction=params.max_bad_fraction,
            input=params.input,
            use_cache=params.use_cache,
            **common,
        )
    )
    features = features_flow(
        FeaturesParams(
            as_of=params.as_of,
            horizon_days=params.horizon_days,
            use_cache=params.use_cache,
            **common,
        )
    )
    prepared = preprocess_flow(PreprocessParams(use_cache=params.use_cache, **common))
    trained = train_flow(TrainParams(device=device, fresh=params.fresh, **common))
    scored = batch_inference_flow(InferenceParams(as_of=features.as_of, **common))
    stages = [validated.report, features.report, prepared.report, trained.report, scored.report]
    for report in stages:
        report.pool = embedded_pool(report.device)
        report.peak_memory_mb = peak_memory_mb()
    summary = pipeline_summary(
        run_id, run_id, validated, features, trained, scored, stages, started
    )
    return _account(summary, settings, store, plan)


def _plan(params: PipelineParams, settings: HybridflowSettings, store: ObjectStore) -> RoutingPlan:
    """The routing plan for this run, also shown as a table artifact."""
    plan = plan_pipeline(
        params.events,
        settings,
        store,
        deadline=params.deadline,
        pinned=params.pinned_pools,
        tight_budget=params.tight_budget,
    )
    publish_plan_table(plan)
    return plan


def _account(
    summary: PipelineSummary, settings: HybridflowSettings, store: ObjectStore, plan: RoutingPlan
) -> PipelineSummary:
    """Record the stages' profiles, price the run, and put plan and cost in the summary."""
    fresh = [r for r in summary.stages if not r.cached]
    cost = account_run(store, settings, summary.run_id, fresh)
    publish_cost_table(cost)
    return summary.model_copy(
        update={
            "plan": [
                {"stage": d.stage, "pool": d.pool, "reason": d.reason} for d in plan.decisions
            ],
            "cost": cost.model_dump(mode="json"),
        }
    )


def pipeline_summary(
    flow_run_id: str,
    run_id: str,
    validated: ValidateResult,
    features: FeaturesResult,
    trained: TrainResult,
    scored: InferenceResult,
    stages: list[StageReport],
    started: float,
) -> PipelineSummary:
    """The run summary from the stages' results (``started``: perf_counter at the start)."""
    return PipelineSummary(
        status="completed",
        flow_run_id=flow_run_id,
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
    )


def deployed_run_key(params: PipelineParams, store_uri: str) -> str:
    """Explicit ``run_id``, a fresh id with ``fresh``, else the key of these inputs."""
    if params.run_id:
        return params.run_id
    if params.fresh:
        return resolve_run_id(None)
    parameters = params.output_parameters() | {"store": store_uri}
    return pipeline_run_key(parameters, events_fingerprint(params.events))


def _pipeline_deployed(
    params: PipelineParams, settings: HybridflowSettings, store: ObjectStore, plan: RoutingPlan
) -> PipelineSummary:
    """The DAG dispatched to the pools the plan chose; stages already complete under the run
    key are skipped."""
    started = time.perf_counter()
    run_id = deployed_run_key(params, store.uri)
    missing = sorted({pool for d in plan.decisions for pool in d.profile_missing_on})
    if params.profile_missing and missing:
        schedule_profiling_runs(
            missing,
            params.model_dump(mode="json", include={"events", "as_of", "horizon_days", "input"})
            | {"store": store.uri},
        )
    poll = settings.dispatch_poll_seconds
    common = {"run_id": run_id, "store": store.uri}
    prepare_params = PrepareParams(
        events=params.events,
        as_of=params.as_of,
        horizon_days=params.horizon_days,
        max_bad_fraction=params.max_bad_fraction,
        input=params.input,
        use_cache=params.use_cache,
        **common,
    )
    pools = {unit: plan.pool_for(unit.routed_by) for unit in (PREPARE, TRAIN, BATCH_INFERENCE)}
    origins = {PREPARE: run_or_reuse(PREPARE, pools[PREPARE], prepare_params, store, run_id, poll)}
    validated = read_stage_manifest(store, run_id, "validate", ValidateResult)
    features = read_stage_manifest(store, run_id, "features", FeaturesResult)
    prepared = read_stage_manifest(store, run_id, "preprocess", PreprocessResult)
    train_params = TrainParams(device=params.device, fresh=params.fresh, **common)
    origins[TRAIN] = run_or_reuse(TRAIN, pools[TRAIN], train_params, store, run_id, poll)
    trained = read_stage_manifest(store, run_id, "train", TrainResult)
    scoring_params = InferenceParams(as_of=features.as_of, **common)
    origins[BATCH_INFERENCE] = run_or_reuse(
        BATCH_INFERENCE, pools[BATCH_INFERENCE], scoring_params, store, run_id, poll
    )
    scored = read_stage_manifest(store, run_id, "batch_inference", InferenceResult)

    results = [
        (validated, PREPARE),
        (features, PREPARE),
        (prepared, PREPARE),
        (trained, TRAIN),
        (scored, BATCH_INFERENCE),
    ]
    stages = [
        r.report.model_copy(update={"pool": origins[u].pool, "cached": origins[u].cached})
        for r, u in results
    ]
    flow_run_id = resolve_run_id(None)
    summary = pipeline_summary(
        flow_run_id, run_id, validated, features, trained, scored, stages, started
    )
    publish_pipeline_artifacts(
        summary, store.key_uri(f"{VERSIONS}/{trained.model_version}/manifest.json")
    )
    return _account(summary, settings, store, plan)
