"""Flow ``model-refresh`` (gpu-pool, on a schedule): train on the newest window, gate, promote.

Without a production model there is nothing to refresh: the flow refuses at once (one clear
error, nothing written) instead of training a first model behind the pipeline's back.

Reuses the stage flows: prepare-data (validate -> features -> preprocess at ``as_of``, i.e.
labels from the most recent horizon window) and train (warm start from production when the
features match, production evaluated on the same test split, promotion gate). ``promote=always``
lets an operator push the candidate through. Serving endpoints pick the new production up
within one poll interval.
"""

from __future__ import annotations

import time

from prefect import flow
from pydantic import Field

from flows.artifacts import publish_refresh_table
from flows.context import resolve_run_id
from flows.params import RunInputs, StageParams, resolve
from flows.prepare import prepare_flow
from flows.train import train_flow
from infra.registry import ModelRegistry
from tasks.stages.records import (
    FeaturesResult,
    PreprocessResult,
    ValidateResult,
    read_stage_manifest,
)
from tasks.stages.refresh import (
    PromoteMode,
    RefreshResult,
    apply_promotion_mode,
    production_manifest,
    refresh_horizon,
    require_production,
)


class RefreshParams(RunInputs):
    """Parameters of a model refresh (``horizon_days`` defaults to production's)."""

    events: str = Field(description="Parquet/CSV file or folder of events (newest data)")
    promote: PromoteMode = "if-better"


@flow(name="model-refresh")
def refresh_flow(params: RefreshParams) -> RefreshResult:
    """Fine-tune production on the most recent window and promote through the gate."""
    started = time.perf_counter()
    run = resolve(params)
    registry = ModelRegistry(run.store)
    production = require_production(production_manifest(registry))
    run_id = resolve_run_id(None)
    horizon = refresh_horizon(params.horizon_days, production, run.settings.horizon_days)
    stage_params = StageParams.model_validate(
        params.model_dump(include=set(RunInputs.model_fields))
        | {"run_id": run_id, "horizon_days": horizon, "store": run.store.uri}
    )
    prepare_flow(stage_params)
    trained = train_flow(stage_params)
    promoted, forced, reason = apply_promotion_mode(registry, trained, params.promote)
    after = registry.alias()
    features = read_stage_manifest(run.store, run_id, "features", FeaturesResult)
    result = RefreshResult(
        run_id=run_id,
        as_of=features.as_of,
        horizon_days=features.horizon_days,
        candidate_version=trained.model_version,
        production_before=production.version,
        production_after=after.version if after else None,
        warm_start=trained.warm_start,
        promoted=promoted,
        forced=forced,
        reason=reason,
        metrics=trained.metrics,
        stages=[
            read_stage_manifest(run.store, run_id, "validate", ValidateResult).report,
            features.report,
            read_stage_manifest(run.store, run_id, "preprocess", PreprocessResult).report,
            trained.report,
        ],
        seconds=time.perf_counter() - started,
    )
    publish_refresh_table(result)
    return result
