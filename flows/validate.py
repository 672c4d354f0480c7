"""Flow ``validate`` (cpu-pool): events in, good events + quarantine out."""

from __future__ import annotations

from flows.artifacts import publish_quarantine_table, publish_stage_table
from flows.context import record_stage_result, resolve_run_id
from flows.dag import VALIDATE
from flows.params import StageParams, resolve
from flows.params_flow import params_flow
from infra.compute.spark import SparkOnDemand
from infra.errors import HybridflowInputError
from tasks.data.time_windows import event_time_bounds
from tasks.reporting.records import ValidateResult
from tasks.stages.validate import validate_stage


@params_flow(name=VALIDATE.flow_name)
def validate_flow(params: StageParams) -> ValidateResult:
    """Check events against the contract and quarantine bad rows with a reason."""
    if not params.events:
        raise HybridflowInputError("validate needs events: a Parquet/CSV file or folder")
    run = resolve(params)
    run_id = resolve_run_id(params.run_id)
    result = validate_stage(
        SparkOnDemand(run.settings),
        run.store,
        run_id,
        params.events,
        run.max_bad_fraction,
        options=run.input,
        use_cache=run.use_cache,
        on_quarantine=publish_quarantine_table,
        in_process_rows=run.settings.in_process_rows,
        bounds=event_time_bounds(run.settings),
    )
    result = record_stage_result(run.store, run_id, VALIDATE.name, result)
    publish_stage_table(
        result.report, quarantined=result.rows_quarantined, **result.quarantine_reasons
    )
    return result
