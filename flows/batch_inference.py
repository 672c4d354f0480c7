"""Flow ``batch-inference`` (cpu-pool): score every customer with a registry version."""

from __future__ import annotations

from flows.artifacts import ProgressArtifact, publish_predictions_link, publish_stage_table
from flows.context import record_stage_result
from flows.dag import BATCH_INFERENCE, upstream_results
from flows.params import StageParams, resolve
from flows.params_flow import params_flow
from infra.compute.spark import SparkOnDemand
from tasks.reporting.records import InferenceResult
from tasks.stages.batch_inference import batch_inference_stage, scoring_as_of


@params_flow(name=BATCH_INFERENCE.flow_name)
def batch_inference_flow(params: StageParams) -> InferenceResult:
    """Spark mapInArrow scoring; predictions replace earlier ones for the same as-of.

    Inside a pipeline run (``run_id``) T is the one the run's features stage resolved."""
    run = resolve(params)
    upstream = upstream_results(run.store, params.run_id, BATCH_INFERENCE) if params.run_id else {}
    result = batch_inference_stage(
        SparkOnDemand(run.settings),
        run.store,
        run.as_of,
        params.model_version,
        progress_interval_s=run.settings.progress_interval_s,
        progress_sink=ProgressArtifact("batch_inference"),
        in_process_rows=run.settings.in_process_rows,
        **upstream,
    )
    result = record_stage_result(run.store, params.run_id, BATCH_INFERENCE.name, result)
    publish_predictions_link(result, scoring_as_of(run.as_of, **upstream))
    publish_stage_table(
        result.report, model_version=result.model_version, model_loads=result.model_loads
    )
    return result
