"""Flow ``features`` (cpu-pool): point-in-time features and labels in Spark."""

from __future__ import annotations

import datetime as dt

from prefect import flow
from pydantic import BaseModel, Field

from flows._glue import publish_stage_table, resolve_run_id, stage_context
from infra.spark import get_spark
from tasks.build_features import features_stage
from tasks.stage_records import (
    FeaturesResult,
    ValidateResult,
    read_stage_manifest,
    write_stage_manifest,
)


class FeaturesParams(BaseModel):
    """Parameters of the features stage."""

    run_id: str = Field(description="pipeline run whose validated events to use")
    as_of: dt.date | None = Field(default=None, description="T (default: last event's date)")
    horizon_days: int | None = Field(default=None, ge=1, le=3650)
    use_cache: bool | None = Field(default=None, description="default: HYBRIDFLOW_STAGE_CACHE")
    store: str | None = None


@flow(name="features")
def features_flow(params: FeaturesParams) -> FeaturesResult:
    """Training examples at T-H (labels in (T-H, T]) and scoring features at T."""
    settings, store = stage_context(params.store)
    run_id = resolve_run_id(params.run_id)
    validated = read_stage_manifest(store, run_id, "validate", ValidateResult)
    result = features_stage(
        get_spark(settings),
        store,
        run_id,
        validated,
        params.as_of or settings.as_of,
        params.horizon_days or settings.horizon_days,
        use_cache=settings.stage_cache if params.use_cache is None else params.use_cache,
    )
    write_stage_manifest(store, run_id, "features", result)
    publish_stage_table(
        result.report, as_of=result.as_of, positive_rate=round(result.positive_rate, 4)
    )
    return result
