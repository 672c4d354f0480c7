"""Flow ``batch-inference`` (cpu-pool): score every customer with a registry version."""

from __future__ import annotations

import datetime as dt

from prefect import flow
from prefect.artifacts import create_link_artifact
from pydantic import BaseModel, Field

from flows._glue import publish_stage_table, stage_context
from infra.spark import get_spark
from tasks.scoring_stage import batch_inference_stage
from tasks.stage_records import InferenceResult, write_stage_manifest


class InferenceParams(BaseModel):
    """Parameters of batch inference."""

    as_of: dt.date = Field(description="score the features published for this date")
    model_version: str | None = Field(default=None, description="default: production")
    run_id: str | None = None
    store: str | None = None


@flow(name="batch-inference")
def batch_inference_flow(params: InferenceParams) -> InferenceResult:
    """Spark mapInArrow scoring; predictions replace earlier ones for the same as-of."""
    settings, store = stage_context(params.store)
    result = batch_inference_stage(
        get_spark(settings),
        store,
        params.as_of,
        params.model_version,
        progress_interval_s=settings.progress_interval_s,
    )
    if params.run_id:
        write_stage_manifest(store, params.run_id, "batch_inference", result)
    create_link_artifact(
        key="predictions", link=result.predictions_uri, description=f"predictions {params.as_of}"
    )
    publish_stage_table(
        result.report, model_version=result.model_version, model_loads=result.model_loads
    )
    return result
