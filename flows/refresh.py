"""Flow ``model-refresh`` (gpu-pool, on a schedule): train on the newest window, gate, promote.

Reuses the stage flows: prepare-data (validate -> features -> preprocess at ``as_of``, i.e.
labels from the most recent horizon window) and train (warm start from production when the
features match, production evaluated on the same test split, promotion gate). ``promote=always``
lets an operator push the candidate through. Serving endpoints pick the new production up
within one poll interval.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Literal

from prefect import flow
from prefect.artifacts import create_table_artifact
from pydantic import BaseModel, Field

from flows._glue import resolve_run_id, stage_context
from flows.prepare import PrepareParams, prepare_flow
from flows.train import TrainParams, train_flow
from infra.registry import ModelRegistry
from tasks.refresh import (
    PromoteMode,
    RefreshResult,
    apply_promotion_mode,
    production_manifest,
    refresh_horizon,
)
from tasks.stage_records import (
    FeaturesResult,
    PreprocessResult,
    ValidateResult,
    read_stage_manifest,
)


class RefreshParams(BaseModel):
    """Parameters of a model refresh."""

    events: str = Field(description="Parquet/CSV file or folder of events (newest data)")
    as_of: dt.date | None = Field(default=None, description="T (default: last event's date)")
    horizon_days: int | None = Field(
        default=None, ge=1, le=3650, description="default: production's horizon"
    )
    promote: PromoteMode = "if-better"
    max_bad_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    device: Literal["auto", "cuda", "cpu"] = "auto"
    store: str | None = None


@flow(name="model-refresh")
def refresh_flow(params: RefreshParams) -> RefreshResult:
    """Fine-tune production on the most recent window and promote through the gate."""
    started = time.perf_counter()
    settings, store = stage_context(params.store)
    registry = ModelRegistry(store)
    production = production_manifest(registry)
    run_id = resolve_run_id(None)
    horizon = refresh_horizon(params.horizon_days, production, settings.horizon_days)
    prepare_flow(
        PrepareParams(
            events=params.events,
            as_of=params.as_of,
            horizon_days=horizon,
            max_bad_fraction=params.max_bad_fraction,
            run_id=run_id,
            store=params.store,
        )
    )
    trained = train_flow(TrainParams(run_id=run_id, device=params.device, store=params.store))
    promoted, forced, reason = apply_promotion_mode(registry, trained, params.promote)
    after = registry.alias()
    features = read_stage_manifest(store, run_id, "features", FeaturesResult)
    result = RefreshResult(
        run_id=run_id,
        as_of=features.as_of,
        horizon_days=features.horizon_days,
        candidate_version=trained.model_version,
        production_before=production.version if production else None,
        production_after=after.version if after else None,
        warm_start=trained.warm_start,
        promoted=promoted,
        forced=forced,
        reason=reason,
        metrics=trained.metrics,
        stages=[
            read_stage_manifest(store, run_id, "validate", ValidateResult).report,
            features.report,
            read_stage_manifest(store, run_id, "preprocess", PreprocessResult).report,
            trained.report,
        ],
        seconds=time.perf_counter() - started,
    )
    create_table_artifact(
        table=[
            {"item": k, "value": str(v)}
            for k, v in result.model_dump(exclude={"stages", "metrics"}).items()
        ],
        key="model-refresh",
        description=f"refresh as_of {result.as_of}: {reason}",
    )
    return result
