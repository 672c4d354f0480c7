"""Flow ``model-refresh`` (cpu-pool): train on the newest window, gate, promote.

Started by the deployment triggers of prefect.yaml (drift detected; new data while production is
older than the configured age), by the slow safety-net schedule, or by hand; ``trigger`` and
``reason`` say which, also in the run's name. Without a production model there is nothing to
refresh: the flow refuses at once (one clear error, nothing written) instead of training a first
model behind the pipeline's back.

A refresh is the stage graph's prepare -> train slice (:data:`flows.dag.REFRESH_UNITS`) run by
the pipeline's executors under a routing plan of its own, asked of the router as the
pipeline's is (:func:`tasks.policy.planning.plan_pipeline` over the slice's stages): embedded,
every stage in this process (training on the CPU when the router sends it to cpu-pool);
deployed (inside a deployment run), each unit on the pool the router chose for the stage that
routes it — the prepare-data unit (validate -> features -> preprocess at ``as_of``, i.e. labels
from the most recent horizon window) on cpu-pool, the train unit on gpu-pool unless the router
finds the CPU fits the model (production's
family, fine-tuned from production when its features match — or the ``families`` asked for, a
family other than production's fitted fresh and the reason saying so — production evaluated on
the same test split, promotion gate). ``promote=always`` lets an operator push the candidate
through. A promotion records the new version's drift reference and emits
``hybridflow.model.promoted``; serving endpoints pick the new production up within one poll
interval.
"""

from __future__ import annotations

import logging
import time
from typing import Literal

from pydantic import Field

from flows.artifacts import publish_cost_table, publish_plan_table, publish_refresh_table
from flows.context import current_pool, resolve_run_id
from flows.dag import FEATURES, REFRESH_UNITS, STAGE_KINDS, TRAIN, routed_stages, stage_result
from flows.events import emit, model_promoted
from flows.executors import (
    dispatch_mode,
    routed_device,
    run_in_process,
    run_on_pools,
    unit_pools,
)
from flows.params import ResolvedRun, RunInputs, StageParams, resolve
from flows.params_flow import params_flow
from infra.compute.spark import SparkOnDemand
from infra.routing.accounting import account_refresh, account_run, embedded_pool
from infra.routing.costs import CostReport
from infra.storage.registry import ModelRegistry
from tasks.policy.planning import plan_pipeline
from tasks.policy.refresh import (
    PromoteMode,
    RefreshResult,
    RefreshTrigger,
    apply_promotion_mode,
    production_manifest,
    refresh_horizon,
    require_production,
)
from tasks.reporting.records import StageReport
from tasks.stages.drift import ensure_reference

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
    mode: Literal["auto", "embedded", "deployed"] = Field(
        default="auto",
        description="deployed: each unit on the pool the router chooses (prepare-data on "
        "cpu-pool, train where the model fits); auto: deployed in a deployment run",
    )

    @property
    def run_label(self) -> str:
        """The run's name: what started it and for which date."""
        return f"refresh-{self.trigger}" + (f"-{self.as_of}" if self.as_of else "")


@params_flow(name="model-refresh", flow_run_name="{params.run_label}")
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
    plan = plan_pipeline(
        params.events,
        run.settings,
        run.store,
        stages=routed_stages(REFRESH_UNITS),
        families=stage_params.families,
    )
    publish_plan_table(plan)
    stage_params = stage_params.model_copy(
        update={"device": routed_device(stage_params.device, plan)}
    )
    deployed = dispatch_mode(params.mode) == "deployed"
    if deployed:
        run_on_pools(
            stage_params, unit_pools(plan, REFRESH_UNITS), run.store, run.settings, REFRESH_UNITS
        )
    else:
        run_in_process(stage_params, REFRESH_UNITS)
    trained = stage_result(run.store, run_id, TRAIN)
    features = stage_result(run.store, run_id, FEATURES)
    promoted, forced, reason = apply_promotion_mode(registry, trained, params.promote)
    after = registry.alias()
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
        stages=_stage_reports(run, run_id),
        seconds=time.perf_counter() - started,
        trigger=params.trigger,
        trigger_reason=params.reason,
    )
    if promoted:
        _after_promotion(run, result, params)
    publish_refresh_table(result)
    cost = _account(run, result, deployed, time.perf_counter() - started)
    publish_cost_table(cost)
    return result


def _stage_reports(run: ResolvedRun, run_id: str) -> list[StageReport]:
    """The report of every stage of the refresh's slice, in graph order."""
    return [
        stage_result(run.store, run_id, stage).report  # type: ignore[attr-defined]
        for unit in REFRESH_UNITS
        for stage in unit.stages
    ]


def _account(run: ResolvedRun, result: RefreshResult, deployed: bool, seconds: float) -> CostReport:
    """Record the fresh stages' profiles and price the refresh: deployed, each stage on the pool
    it ran on (as a pipeline run is); embedded, its whole wall time on the node it held."""
    fresh = [r.profile(result.run_id) for r in result.stages if not r.cached]
    if deployed:
        return account_run(
            run.store,
            run.settings,
            result.run_id,
            fresh,
            STAGE_KINDS,
            kind="refresh",
            refresh=result.trigger,
        )
    train_device = result.stages[-1].device
    pool = current_pool(embedded_pool(train_device))
    return account_refresh(
        run.store, run.settings, result.run_id, fresh, pool, seconds, result.trigger
    )


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
