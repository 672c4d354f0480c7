"""Flow ``drift`` (cpu-pool): the scoring features at T against production's training data.

Runs at the end of every pipeline run (and by hand: ``hybridflow drift --as-of D``). Publishes
the table artifact ``drift`` and the report at ``runs/<run_id>/drift.json``; what the result
means for a refresh is the pipeline's decision, not this flow's.
"""

from __future__ import annotations

from prefect import flow
from pydantic import Field

from flows.artifacts import publish_drift_table
from flows.context import resolve_run_id
from flows.dag import FEATURES, stage_result
from flows.params import RunInputs, resolve
from infra.compute.spark import SparkOnDemand
from infra.errors import HybridflowInputError
from infra.layout import stage_manifest_key
from tasks.data.drift_records import DriftReport
from tasks.reporting.records import write_stage_manifest
from tasks.stages.drift import measure_drift

DRIFT_STAGE = "drift"


class DriftParams(RunInputs):
    """Which features to check (those published for ``as_of``) and against which model."""

    model_version: str | None = Field(
        default=None, description="compare with this version's training data (default: production)"
    )
    run_id: str | None = Field(default=None, description="the run the report is filed under")


@flow(name="drift")
def drift_flow(params: DriftParams) -> DriftReport:
    """PSI per feature, unseen customers and score PSI at ``as_of`` against the model."""
    run = resolve(params)
    if run.as_of is None:
        raise HybridflowInputError("the drift check needs as_of (the features' date)")
    run_id = resolve_run_id(params.run_id)
    features_prefix = None  # inside a run: its own scoring features, else the date's newest
    if run.store.exists(stage_manifest_key(run_id, FEATURES.name)):
        features = stage_result(run.store, run_id, FEATURES)
        features_prefix = features.scoring_prefix if features.as_of == run.as_of else None
    report = measure_drift(
        SparkOnDemand(run.settings),
        run.store,
        run_id,
        run.as_of,
        run.settings.drift,
        params.model_version,
        features_prefix,
    )
    write_stage_manifest(run.store, run_id, DRIFT_STAGE, report)
    publish_drift_table(report)
    return report
