"""Flow ``preprocess`` (cpu-pool): split, fit the normaliser, publish the training snapshot."""

from __future__ import annotations

from flows.artifacts import publish_stage_table
from flows.context import record_stage_result, resolve_run_id
from flows.dag import PREPROCESS, upstream_results
from flows.params import StageParams, resolve
from flows.params_flow import params_flow
from infra.compute.spark import SparkOnDemand
from tasks.reporting.records import PreprocessResult
from tasks.stages.preprocess import preprocess_stage


@params_flow(name=PREPROCESS.flow_name)
def preprocess_flow(params: StageParams) -> PreprocessResult:
    """Publish the feature snapshot the GPU stage trains on."""
    run = resolve(params)
    run_id = resolve_run_id(params.run_id)
    result = preprocess_stage(
        SparkOnDemand(run.settings),
        run.store,
        seed=run.settings.train.seed,
        use_cache=run.use_cache,
        run_id=run_id,
        in_process_rows=run.settings.in_process_rows,
        **upstream_results(run.store, run_id, PREPROCESS),
    )
    result = record_stage_result(run.store, run_id, PREPROCESS.name, result)
    publish_stage_table(result.report, **result.split_counts)
    return result
