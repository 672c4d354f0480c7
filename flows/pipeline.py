"""Flow ``pipeline``: the stage graph of :mod:`flows.dag`, run embedded or deployed.

Orchestration only. Each stage is its own flow and reads what the previous one published in the
store, never in-memory objects. Between data preparation and training, one contender unit per
model family fits and judges that family (deployed: all at once, each on the pool the router
chose for it); the train stage then crowns the champion from what they published. Both modes make the same routing decisions from one plan:
embedded runs every stage here (training on the CPU when the router sends it to cpu-pool);
deployed dispatches each unit to the pool the plan chose, under a run key derived from the
parameters and the events' fingerprint, so a re-run resumes where a failed run stopped.
"""

from __future__ import annotations

import logging
import time
from typing import Literal

from pydantic import Field

from flows.artifacts import publish_cost_table, publish_pipeline_artifacts, publish_plan_table
from flows.context import resolve_run_id
from flows.dag import (
    CONTENDER,
    PIPELINE_UNITS,
    PREPROCESS,
    ROUTED_STAGES,
    STAGE_KINDS,
    UNITS_AFTER_CONTENDERS,
    UNITS_BEFORE_CONTENDERS,
    run_results,
    stage_result,
)
from flows.executors import (
    UnitOrigin,
    dispatch_mode,
    routed_device,
    run_contenders_in_process,
    run_contenders_on_pools,
    run_in_process,
    run_on_pools,
    schedule_profiling_runs,
    unit_pools,
)
from flows.params import DevicePreference, StageParams, resolve
from flows.params_flow import params_flow
from flows.signals import signal_refresh
from infra import startup
from infra.layout import version_manifest_key
from infra.routing.accounting import account_run
from infra.routing.planner import RoutingPlan
from infra.routing.pools import CPU_POOL
from infra.settings import HybridflowSettings
from infra.storage.store import ObjectStore
from tasks.policy.contending import contenders_at_once, longest_first
from tasks.policy.planning import plan_pipeline
from tasks.policy.run_key import events_fingerprint, pipeline_run_key
from tasks.reporting.records import PipelineSummary, contender_stage
from tasks.reporting.summary import StageOrigin, run_summary

log = logging.getLogger(__name__)


class PipelineParams(StageParams):
    """Parameters of a whole pipeline run: the stages' parameters plus routing and dispatch."""

    events: str = Field(description="Parquet/CSV file or folder of events")
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

    def stage_params(self, run_id: str, store_uri: str, device: DevicePreference) -> StageParams:
        """What every stage of this run gets."""
        shared = self.model_dump(include=set(StageParams.model_fields))
        return StageParams.model_validate(
            shared | {"run_id": run_id, "store": store_uri, "device": device}
        )


@params_flow(name="pipeline")
def pipeline_flow(params: PipelineParams) -> PipelineSummary:
    """The whole DAG: in this process (embedded) or unit by unit on the pools (deployed)."""
    started = time.perf_counter()
    startup.pipeline_started()
    run = resolve(params)
    families = contending_families(params.families, run.settings)
    plan = plan_pipeline(
        params.events,
        run.settings,
        run.store,
        deadline=params.deadline,
        pinned=params.pinned_pools,
        tight_budget=params.tight_budget,
        stages=ROUTED_STAGES,
        families=families,
    )
    publish_plan_table(plan)
    deployed = dispatch_mode(params.mode) == "deployed"
    run_id = deployed_run_key(params, run.store.uri) if deployed else resolve_run_id(None)
    stage_params = params.stage_params(run_id, run.store.uri, routed_device(params.device, plan))
    contenders = contender_units(stage_params, plan, families)
    if deployed:
        _profile_missing_pools(params, plan, run.store.uri)
        pools = unit_pools(plan)
        units = run_on_pools(
            stage_params, pools, run.store, run.settings, units=UNITS_BEFORE_CONTENDERS
        )
        ran = run_contenders_on_pools(contenders, run.store, run.settings)
        units |= run_on_pools(
            stage_params, pools, run.store, run.settings, units=UNITS_AFTER_CONTENDERS
        )
    else:
        units = run_in_process(stage_params, UNITS_BEFORE_CONTENDERS)
        at_once = embedded_contenders_at_once(run.store, run_id, run.settings, contenders)
        order = longest_first(list(contenders)) if at_once > 1 else list(contenders)
        ran = run_contenders_in_process({f: contenders[f][1] for f in order}, at_once)
        ran = {f: ran[f] for f in contenders}  # the run's order of families again
        units |= run_in_process(stage_params, UNITS_AFTER_CONTENDERS)
    steps = startup.startup_breakdown()
    summary = run_summary(
        run.store,
        run_id,
        resolve_run_id(None),
        stage_origins(units) | contender_origins(ran),
        seconds=time.perf_counter() - started,
        **run_results(run.store, run_id),
    ).model_copy(
        update={
            "startup_seconds": round(sum(steps.values()), 3) if steps else None,
            "startup": steps,
        }
    )
    publish_pipeline_artifacts(
        summary, run.store.key_uri(version_manifest_key(summary.model_version))
    )
    _, decision, drift = signal_refresh(
        run, summary, params.events, events_fingerprint(params.events)
    )
    summary = summary.model_copy(update={"drift": drift})
    return _account(summary, run.settings, run.store, plan, decision.reason or "skipped")


def contending_families(families: list[str] | None, settings: HybridflowSettings) -> list[str]:
    """The run's model families: the parameter, else ``HYBRIDFLOW_TRAIN__FAMILIES``
    (duplicates dropped, order kept)."""
    return list(dict.fromkeys(families or settings.train.families))


def embedded_contenders_at_once(
    store: ObjectStore,
    run_id: str,
    settings: HybridflowSettings,
    contenders: dict[str, tuple[str, StageParams]],
) -> int:
    """How many contenders this embedded run fits at the same time, from its preprocess
    stage's training rows (:func:`tasks.policy.contending.contenders_at_once`)."""
    rows = stage_result(store, run_id, PREPROCESS).split_counts.get("train", 0)
    at_once = contenders_at_once(settings, rows, {f: p.device for f, (_, p) in contenders.items()})
    if at_once > 1:
        log.info("contenders: %d at a time, a thread each (%s training rows)", at_once, f"{rows:,}")
    return at_once


def contender_units(
    params: StageParams, plan: RoutingPlan, families: list[str]
) -> dict[str, tuple[str, StageParams]]:
    """Per family: the pool the plan chose for its contender unit and the unit's parameters
    (that one family; the CPU when the router sent it to cpu-pool and the device is auto)."""
    units = {}
    for family in families:
        pool = plan.pool_for(contender_stage(family))
        device = "cpu" if params.device == "auto" and pool == CPU_POOL else params.device
        units[family] = (pool, params.model_copy(update={"families": [family], "device": device}))
    return units


def contender_origins(ran: dict[str, UnitOrigin]) -> dict[str, StageOrigin]:
    """Per contender stage: the pool its unit ran on and whether an earlier attempt made it."""
    return {
        contender_stage(family): StageOrigin(pool=o.pool, reused=o.cached)
        for family, o in ran.items()
    }


def stage_origins(units: dict[str, UnitOrigin]) -> dict[str, StageOrigin]:
    """Per stage: the pool its unit ran on and whether the unit was reused."""
    return {
        stage.name: StageOrigin(pool=units[u.flow_name].pool, reused=units[u.flow_name].cached)
        for u in PIPELINE_UNITS
        for stage in u.stages
    }


def deployed_run_key(params: PipelineParams, store_uri: str) -> str:
    """Explicit ``run_id``, a fresh id with ``fresh``, else the key of these inputs."""
    if params.run_id:
        return params.run_id
    if params.fresh:
        return resolve_run_id(None)
    parameters = params.output_parameters() | {"store": store_uri}
    return pipeline_run_key(parameters, events_fingerprint(params.events))


def _profile_missing_pools(params: PipelineParams, plan: RoutingPlan, store_uri: str) -> None:
    """With ``profile_missing``: a short profiling run on each pool the router lacks data for."""
    missing = sorted({pool for d in plan.decisions for pool in d.profile_missing_on})
    if params.profile_missing and missing:
        schedule_profiling_runs(
            missing,
            params.model_dump(mode="json", include={"events", "as_of", "horizon_days", "input"})
            | {"store": store_uri},
        )


def _account(
    summary: PipelineSummary,
    settings: HybridflowSettings,
    store: ObjectStore,
    plan: RoutingPlan,
    refresh: str,
) -> PipelineSummary:
    """Record the fresh stages' profiles, price the run, put plan and cost in the summary."""
    fresh = [r.profile(summary.run_id) for r in summary.stages if not r.cached]
    kinds = STAGE_KINDS | {
        r.name: CONTENDER.kind for r in summary.stages if r.name not in STAGE_KINDS
    }
    cost = account_run(store, settings, summary.run_id, fresh, kinds, refresh=refresh)
    publish_cost_table(cost)
    return summary.model_copy(
        update={
            "plan": [
                {"stage": d.stage, "pool": d.pool, "reason": d.reason} for d in plan.decisions
            ],
            "cost": cost.model_dump(mode="json"),
        }
    )
