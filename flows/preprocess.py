"""Flow ``preprocess`` (cpu-pool): split, fit the normaliser, publish the training snapshot."""

from __future__ import annotations

from prefect import flow
from pydantic import BaseModel, Field

from flows._glue import publish_stage_table, stage_context
from infra.spark import get_spark
from tasks.preprocess import preprocess_stage
from tasks.stage_records import (
    FeaturesResult,
    PreprocessResult,
    read_stage_manifest,
    write_stage_manifest,
)


class PreprocessParams(BaseModel):
    """Parameters of the preprocess stage."""

    run_id: str
    use_cache: bool | None = Field(default=None, description="default: HYBRIDFLOW_STAGE_CACHE")
    store: str | None = None


@flow(name="preprocess")
def preprocess_flow(params: PreprocessParams) -> PreprocessResult:
    """Publish the feature snapshot the GPU stage trains on."""
    settings, store = stage_context(params.store)
    features = read_stage_manifest(store, params.run_id, "features", FeaturesResult)
    result = preprocess_stage(
        get_spark(settings),
        store,
        features,
        settings.train.seed,
        use_cache=settings.stage_cache if params.use_cache is None else params.use_cache,
        run_id=params.run_id,
    )
    write_stage_manifest(store, params.run_id, "preprocess", result)
    publish_stage_table(result.report, **result.split_counts)
    return result
