"""Flow ``prepare-data`` (cpu-pool): validate -> features -> preprocess, as one unit."""

from __future__ import annotations

import datetime as dt

from prefect import flow
from pydantic import BaseModel, Field

from flows._glue import resolve_run_id
from flows.features import FeaturesParams, features_flow
from flows.preprocess import PreprocessParams, preprocess_flow
from flows.validate import ValidateParams, validate_flow
from tasks.input_formats import InputOptions


class PrepareParams(BaseModel):
    """Parameters of the data-preparation stages."""

    events: str
    as_of: dt.date | None = None
    horizon_days: int | None = Field(default=None, ge=1, le=3650)
    max_bad_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    input: InputOptions = Field(default_factory=InputOptions)
    use_cache: bool | None = None
    run_id: str | None = None
    store: str | None = None


class PrepareResult(BaseModel):
    """The run id whose manifests hold the outputs, and the snapshot."""

    run_id: str
    snapshot_prefix: str


@flow(name="prepare-data")
def prepare_flow(params: PrepareParams) -> PrepareResult:
    """Everything the train stage needs, published in the store under ``runs/<run_id>/``."""
    run_id = resolve_run_id(params.run_id)
    validate_flow(
        ValidateParams(
            events=params.events,
            run_id=run_id,
            max_bad_fraction=params.max_bad_fraction,
            input=params.input,
            use_cache=params.use_cache,
            store=params.store,
        )
    )
    features_flow(
        FeaturesParams(
            run_id=run_id,
            as_of=params.as_of,
            horizon_days=params.horizon_days,
            use_cache=params.use_cache,
            store=params.store,
        )
    )
    prepared = preprocess_flow(
        PreprocessParams(run_id=run_id, use_cache=params.use_cache, store=params.store)
    )
    return PrepareResult(run_id=run_id, snapshot_prefix=prepared.snapshot_prefix)
