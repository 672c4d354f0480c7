"""Flow ``features`` (cpu-pool): point-in-time features and labels in Spark."""

from __future__ import annotations

from flows.artifacts import publish_stage_table
from flows.context import record_stage_result, resolve_run_id
from flows.dag import FEATURES, upstream_results
from flows.params import StageParams, resolve
from flows.params_flow import params_flow
from infra.compute.spark import SparkOnDemand
from tasks.reporting.records import FeaturesResult
from tasks.stages.features import features_stage, settings_origins


@params_flow(name=FEATURES.flow_name)
def features_flow(params: StageParams) -> FeaturesResult:
    """Training examples at T-H (labels in (T-H, T]) and scoring features at T."""
    run = resolve(params)
    run_id = resolve_run_id(params.run_id)
    result = features_stage(
        SparkOnDemand(run.settings),
        run.store,
        run_id,
        as_of=run.as_of,
        horizon_days=run.horizon_days,
        use_cache=run.use_cache,
        as_of_after_events=params.as_of_after_events,
        in_process_rows=run.settings.in_process_rows,
        origins=settings_origins(run.settings),
        sequence_length=run.settings.sequence_length,
        as_of_grace_days=run.settings.as_of_grace_days,
        **upstream_results(run.store, run_id, FEATURES),
    )
    result = record_stage_result(run.store, run_id, FEATURES.name, result)
    publish_stage_table(
        result.report, as_of=result.as_of, positive_rate=round(result.positive_rate, 4)
    )
    return result
