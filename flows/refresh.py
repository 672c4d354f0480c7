"""Flow ``model-refresh`` (gpu-pool): train on the newest window, gate, promote.

Started by the deployment triggers of prefect.yaml (drift detected; new data while production is
older than the configured age), by the slow safety-net schedule, or by hand; ``trigger`` and
``reason`` say which, also in the run's name. Without a production model there is nothing to
refresh: the flow refuses at once (one clear error, nothing written) instead of training a first
model behind the pipeline's back.

Reuses the stage flows: prepare-data (validate -> features -> preprocess at ``as_of``, i.e.
labels from the most recent horizon window) and train (production's family, fine-tuned from
production when its features match — or the ``families`` asked for, a family other than
production's fitted fresh and the reason saying so — production evaluated on the same test
split, promotion gate). ``promote=always``
lets an operator push the candidate through. A promotion records the new version's drift
reference and emits ``hybridflow.model.promoted``; serving endpoints pick the new production up
within one poll interval.
"""

from __future__ import annotations

import logging
import time

from prefect import flow
from pydantic import Field

from flows.artifacts import publish_cost_table, publish_refresh_table
from flows.context import current_pool, resolve_run_id
from flows.events import emit, model_promoted
from flows.params import ResolvedRun, RunInputs, StageParams, resolve
from flows.prepare import prepare_flow
from flows.train import train_flow
from infra.registry import ModelRegistry
from infra.routing.accounting import account_refresh, embedded_pool
from infra.spark import SparkOnDemand
from tasks.stages.drift import ensure_reference
from tasks.stages.records import (
    FeaturesResult,
    PreprocessResult,
    ValidateResult,
    read_stage_manifest,
)
from tasks.stages.refresh import (
    PromoteMode,
    RefreshResult,
    RefreshTrigger,
    apply_promotion_mode,
    production_manifest,
    refresh_horizon,
    require_production,
)

log = logging.getLogger(__name__)


class RefreshParams(RunInputs):
    """Parameters of a model refresh (``horizon_days`` defaults to production's)."""

    events: str = Field(description="Parquet/CSV file or folder of events (newest data)")
    promote: PromoteMode = "if-better"
    trigger: RefreshTrigger = Field(
        default="manual", description="what started this refresh: manual, schedule, drift, new-data"
    )
    reason: str | None = Field(default=None, description="why, in words (a trigger fills it in)")
    trigger_event: str | None = Field(
        default=None, description="id of the Prefect event that started this refresh"
    )
    families: list[str] | None = Field(
        default=None,
        description="model families to fit (default: production's family, fine-tuned from it)",
    )

    @property
    def run_label(self) -> str:
        """The run's name: what started it and for which date."""
        return f"refresh-{self.trigger}" + (f"-{self.as_of}" if self.as_of else "")


@flow(name="model-refresh", flow_run_name="{params.run_label}")
def refresh_flow(params: RefreshParams) -> RefreshResult:
    """Fine-tune production on the most recent window and promote through the gate."""
    started = time.perf_counter()
    run = resolve(params)
    registry = ModelRegistry(run.store)
    production = require_production(production_manifest(registry))
    run_id = resolve_run_id(None)
    horizon = refresh_horizon(params.horizon_days, production, run.settings.horizon_days)
    stage_params = StageParams.model_validate(
        params.model_dump(include=set(RunInputs.model_fields))
        | {
            "run_id": run_id,
            "horizon_days": horizon,
            "store": run.store.uri,
            "families": params.families or [production.kind],
        }
    )
    prepare_flow(stage_params)
    trained = train_flow(stage_params)
    promoted, forced, reason = apply_promotion_mode(registry, trained, params.promote)
    after = registry.alias()
    features = read_stage_manifest(run.store, run_id, "features", FeaturesResult)
    result = RefreshResult(
        run_id=run_id,
        as_of=features.as_of,
        horizon_days=features.horizon_days,
        candidate_version=trained.model_version,
        production_before=production.version,
        production_after=after.version if after else None,
        warm_start=trained.warm_start,
        family=trained.family,
        start_reason=trained.start_reason,
        promoted=promoted,
        forced=forced,
        reason=reason,
        metrics=trained.metrics,
        stages=[
            read_stage_manifest(run.store, run_id, "validate", ValidateResult).report,
            features.report,
            read_stage_manifest(run.store, run_id, "preprocess", PreprocessResult).report,
            trained.report,
        ],
        seconds=time.perf_counter() - started,
        trigger=params.trigger,
        trigger_reason=params.reason,
    )
    if promoted:
        _after_promotion(run, result, params)
    publish_refresh_table(result)
    cost = account_refresh(
        run.store,
        run.settings,
        run_id,
        [r.profile(run_id) for r in result.stages if not r.cached],
        current_pool(embedded_pool(trained.report.device)),
        time.perf_counter() - started,
        params.trigger,
    )
    publish_cost_table(cost)
    return result


def _after_promotion(run: ResolvedRun, result: RefreshResult, params: RefreshParams) -> None:
    """Record the new production's drift reference (its snapshot is this run's) and say so.
    The promotion stands if the reference cannot be built; the next drift check tries again."""
    try:
        ensure_reference(
            SparkOnDemand(run.settings), run.store, result.candidate_version, run.settings.drift
        )
    except Exception as exc:  # a side record: the promotion already happened
        log.warning("drift reference of %s not recorded: %s", result.candidate_version, exc)
    emit(
        model_promoted(
            result.candidate_version,
            result.production_before,
            result.metrics,
            result.reason,
            {
                "trigger": params.trigger,
                "trigger_reason": params.reason,
                "trigger_event": params.trigger_event,
                "run_id": result.run_id,
            },
        )
    )
