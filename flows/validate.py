"""Flow ``validate`` (cpu-pool): events in, good events + quarantine out."""

from __future__ import annotations

from prefect import flow
from pydantic import BaseModel, Field

from flows._glue import publish_stage_table, resolve_run_id, stage_context
from infra.spark import get_spark
from tasks.stage_records import ValidateResult, write_stage_manifest
from tasks.validate import validate_stage


class ValidateParams(BaseModel):
    """Parameters of the validate stage."""

    events: str = Field(description="Parquet/CSV file or folder of events")
    run_id: str | None = Field(default=None, description="pipeline run id (default: this run)")
    max_bad_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    store: str | None = Field(default=None, description="store URI (default: HYBRIDFLOW_STORE)")


@flow(name="validate")
def validate_flow(params: ValidateParams) -> ValidateResult:
    """Check events against the contract and quarantine bad rows with a reason."""
    settings, store = stage_context(params.store)
    run_id = resolve_run_id(params.run_id)
    max_bad = params.max_bad_fraction
    result = validate_stage(
        get_spark(settings),
        store,
        run_id,
        params.events,
        settings.max_bad_fraction if max_bad is None else max_bad,
    )
    write_stage_manifest(store, run_id, "validate", result)
    publish_stage_table(
        result.report, quarantined=result.rows_quarantined, **result.quarantine_reasons
    )
    return result
