"""Flow ``contender`` (one flow run per model family): fit and judge one contender of a training
run and keep it in the store for the run's train stage.

The pipeline starts one per contending family at the same time, each on the pool the router
chose for that family (deployed: ``contender`` on cpu-pool, ``contender-on-gpu-pool``), and then
the train stage, which registers them, crowns the champion and gates it. ``params.families``
names the one family. A retry resumes the family's fit from its newest checkpoint.
"""

from __future__ import annotations

from prefect.runtime import flow_run

from flows.artifacts import publish_stage_table
from flows.context import current_pool, record_stage_result, resolve_run_id, unit_began
from flows.dag import CONTENDER, upstream_results
from flows.params import StageParams, resolve
from flows.params_flow import params_flow
from infra.errors import HybridflowInputError
from tasks.policy.contending import ContenderResult, TrainingOptions
from tasks.reporting.records import contender_stage
from tasks.stages.contenders import launch_contender


@params_flow(name=CONTENDER.flow_name, retries=1, retry_delay_seconds=5)
def contender_flow(params: StageParams) -> ContenderResult:
    """Fit the one family of ``params.families`` on the run's snapshot and judge it."""
    unit_began()
    if not params.run_id or not params.families or len(params.families) != 1:
        raise HybridflowInputError(
            "a contender unit needs the pipeline's run_id and exactly one family in families"
        )
    run = resolve(params)
    run_id = resolve_run_id(params.run_id)
    (family,) = params.families
    fresh = params.fresh and (flow_run.run_count or 1) <= 1
    result = launch_contender(
        run.store,
        run_id,
        run.settings,
        family,
        device_preference=params.device,
        options=TrainingOptions(fresh=fresh, scratch=params.scratch, pool=current_pool("")),
        **upstream_results(run.store, run_id, CONTENDER),
    )
    result = record_stage_result(run.store, run_id, contender_stage(family), result)
    publish_stage_table(
        result.report,
        family=family,
        version_to_register=result.manifest.version,
        reused=result.reused,
    )
    return result
