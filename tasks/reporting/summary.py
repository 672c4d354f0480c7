"""A pipeline run's summary, built from the stage manifests it published in the store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from infra.layout import stage_manifest_key
from infra.storage.store import ObjectStore
from tasks.reporting.records import (
    FeaturesResult,
    InferenceResult,
    PipelineSummary,
    PreprocessResult,
    StageReportOnly,
    TrainResult,
    ValidateResult,
    contender_stage,
)


@dataclass(frozen=True)
class StageOrigin:
    """Where a stage's output came from in this run: the pool that ran it (None: as its report
    says) and whether an earlier attempt under the same run key had published it."""

    pool: str | None = None
    reused: bool = False


def run_summary(
    store: ObjectStore,
    run_id: str,
    flow_run_id: str,
    origins: dict[str, StageOrigin],
    seconds: float,
    *,
    validate: ValidateResult,
    features: FeaturesResult,
    preprocess: PreprocessResult,
    train: TrainResult,
    batch_inference: InferenceResult,
    **other_stages: BaseModel,
) -> PipelineSummary:
    """The summary ``hybridflow run`` prints, from the stage results of ``run_id`` (the
    manifests it published, handed over by the graph), with the contender units between
    preprocess and train; a stage the summary has no field for still has its stage line."""
    stages = []
    for result in (
        validate,
        features,
        preprocess,
        *contender_results(store, run_id, train),
        train,
        batch_inference,
        *other_stages.values(),
    ):
        report = result.report
        origin = origins.get(report.name, StageOrigin())
        stages.append(
            report.model_copy(
                update={
                    "pool": origin.pool or report.pool,
                    "cached": report.cached or origin.reused,
                }
            )
        )
    return PipelineSummary(
        status="completed",
        flow_run_id=flow_run_id,
        run_id=run_id,
        as_of=features.as_of,
        horizon_days=features.horizon_days,
        model_version=train.model_version,
        promoted=train.promoted,
        promotion_reason=train.decision_reason,
        scored_with=batch_inference.model_version,
        metrics={
            "test_auc": train.metrics["auc"],
            "test_pr_auc": train.metrics["pr_auc"],
            "test_logloss": train.metrics["logloss"],
            "test_ece": train.metrics.get("ece"),
            "n_train": train.n_train,
            "n_test": train.n_test,
            "training_origins": [o.isoformat() for o in features.training_origins],
            "backtest": backtest_summary(train),
            "family": train.family,
            "champion": train.champion_reason,
            "leaderboard": [r.model_dump(mode="json") for r in train.leaderboard],
        },
        predictions_uri=batch_inference.predictions_uri,
        quarantine_uri=validate.quarantine_uri,
        rows_read=validate.rows_read,
        rows_quarantined=validate.rows_quarantined,
        quarantine_reasons=validate.quarantine_reasons,
        rows_scored=batch_inference.rows_scored,
        stages=stages,
        seconds=seconds,
    )


def contender_results(
    store: ObjectStore, run_id: str, trained: TrainResult
) -> list[StageReportOnly]:
    """The reports of the contender units of the run (families that the train stage fitted
    itself have none)."""
    found = []
    for row in trained.leaderboard:
        key = stage_manifest_key(run_id, contender_stage(row.family))
        if store.exists(key):
            found.append(StageReportOnly.model_validate_json(store.get_bytes(key)))
    return found


def backtest_summary(trained: TrainResult) -> dict[str, Any]:
    """``metrics.backtest`` of the summary: the model (calibrated and raw) and the baseline out
    of time, or why the backtest was skipped."""
    if trained.evaluation is None:
        return {"status": "skipped", "reason": "the version was registered without an evaluation"}
    report = trained.evaluation.backtest
    out: dict[str, Any] = report.model_dump(mode="json", exclude={"result", "calibration"})
    if report.result is not None:
        result = report.result
        out |= {
            "model": result.model.model_dump(mode="json"),
            "model_uncalibrated": result.model_uncalibrated.model_dump(mode="json"),
            "baseline": result.baseline.model_dump(mode="json"),
            "calibration": report.calibration.describe() if report.calibration else None,
            "calibration_methods": {
                k: v.model_dump() for k, v in result.calibration_methods.items()
            },
        }
    return out
