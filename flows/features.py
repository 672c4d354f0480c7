"""Flow ``features`` (cpu-pool): point-in-time features and labels in Spark."""

from __future__ import annotations

from prefect import flow

from flows.artifacts import publish_stage_table
from flows.context import record_stage_result, resolve_run_id
from flows.dag import FEATURES
from flows.params import StageParams, resolve
from infra.spark import SparkOnDemand
from tasks.stages.features import features_stage
from tasks.stages.records import FeaturesResult, ValidateResult, read_stage_manifest


@flow(name=FEATURES.flow_name)
def features_flow(params: StageParams) -> FeaturesResult:
    """Training examples at T-H (labels in (T-H, T]) and scoring features at T."""
    run = resolve(params)
    run_id = resolve_run_id(params.run_id)
    validated = read_stage_manifest(run.store, run_id, "validate", ValidateResult)
    result = features_stage(
        SparkOnDemand(run.settings),
        run.store,
        run_id,
        validated,
        run.as_of,
        run.horizon_days,
        use_cache=run.use_cache,
        as_of_after_events=params.as_of_after_events,
    )
    result = record_stage_result(run.store, run_id, FEATURES.name, result)
    publish_stage_table(
        result.report, as_of=result.as_of, positive_rate=round(result.positive_rate, 4)
    )
    return result
