"""Flow ``validate`` (cpu-pool): events in, good events + quarantine out."""

from __future__ import annotations

from prefect import flow
from prefect.artifacts import create_table_artifact
from pydantic import BaseModel, Field

from flows._glue import publish_stage_table, resolve_run_id, stage_context
from infra.spark import get_spark
from tasks.input_formats import InputOptions
from tasks.stage_records import ValidateResult, write_stage_manifest
from tasks.validate import validate_stage


class ValidateParams(BaseModel):
    """Parameters of the validate stage."""

    events: str = Field(description="Parquet/CSV file or folder of events")
    run_id: str | None = Field(default=None, description="pipeline run id (default: this run)")
    max_bad_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    input: InputOptions = Field(default_factory=InputOptions, description="how to read the events")
    use_cache: bool | None = Field(default=None, description="default: HYBRIDFLOW_STAGE_CACHE")
    store: str | None = Field(default=None, description="store URI (default: HYBRIDFLOW_STORE)")


@flow(name="validate")
def validate_flow(params: ValidateParams) -> ValidateResult:
    """Check events against the contract and quarantine bad rows with a reason."""
    settings, store = stage_context(params.store)
    run_id = resolve_run_id(params.run_id)
    max_bad = params.max_bad_fraction
    defaults = InputOptions(
        column_map=settings.column_map,
        csv_delimiter=settings.csv_delimiter,
        timestamp_format=settings.timestamp_format,
    )
    result = validate_stage(
        get_spark(settings),
        store,
        run_id,
        params.events,
        settings.max_bad_fraction if max_bad is None else max_bad,
        options=params.input.merged_with(defaults),
        use_cache=settings.stage_cache if params.use_cache is None else params.use_cache,
        on_quarantine=publish_quarantine_table,
    )
    write_stage_manifest(store, run_id, "validate", result)
    publish_stage_table(
        result.report, quarantined=result.rows_quarantined, **result.quarantine_reasons
    )
    return result


def publish_quarantine_table(result: ValidateResult) -> None:
    """A table artifact with the quarantined rows per reason (also when the run then fails)."""
    rows = [
        {"reason": reason, "rows": count, "share": f"{count / max(result.rows_read, 1):.4%}"}
        for reason, count in sorted(result.quarantine_reasons.items())
    ]
    create_table_artifact(
        table=rows or [{"reason": "(none)", "rows": 0, "share": "0%"}],
        key="quarantine",
        description=f"{result.rows_quarantined} of {result.rows_read} rows quarantined: "
        f"{result.quarantine_uri}",
    )
