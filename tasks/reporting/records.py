"""What each stage hands to the next: small JSON manifests in the store, holding only URIs.

``runs/<run_id>/<stage>.json`` is written last by a stage, so it exists only for a stage that
finished; the next stage (possibly on another machine) reads it and nothing else.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, TypeVar

from pydantic import BaseModel, Field

from infra.errors import HybridflowInputError
from infra.layout import stage_manifest_key
from infra.routing.profiles import StageProfile
from infra.storage.store import ObjectStore
from tasks.data.engine_choice import EngineChoice
from tasks.ml.champion import LeaderboardRow
from tasks.ml.evaluation import ModelEvaluation

M = TypeVar("M", bound=BaseModel)

CONTENDER_STAGE_PREFIX = "contender-"


def contender_stage(family: str) -> str:
    """The stage name of one family's contender unit (its manifest, report and profiles)."""
    return f"{CONTENDER_STAGE_PREFIX}{family}"


class StageReport(BaseModel):
    """Per-stage figures shown in the summary, the UI and the cost report."""

    name: str
    seconds: float
    device: str = "cpu"
    pool: str = "embedded"
    rows_in: int | None = None
    rows_out: int | None = None
    cached: bool = False
    peak_memory_mb: float | None = None
    spark_jobs: int | None = Field(
        default=None, description="Spark jobs the stage ran (None: no Spark, or cached)"
    )
    engine: str | None = Field(
        default=None,
        description="the engine that ran it: in-process, spark, spark-per-bucket, "
        "spark-per-partition (tasks/data/engine_choice.py; None: not a CPU stage)",
    )
    engine_reason: str | None = Field(default=None, description="why that engine")

    def with_engine(self, choice: EngineChoice) -> StageReport:
        """This report with the stage's engine choice on it."""
        return self.model_copy(update={"engine": choice.engine, "engine_reason": choice.reason})

    def profile(self, run_id: str, pool: str | None = None) -> StageProfile:
        """This run's measurements as a profile of ``pool`` (default: the pool it ran on)."""
        return StageProfile(
            stage=self.name,
            pool=pool or self.pool,
            device=self.device,
            rows=self.rows_in or 0,
            seconds=self.seconds,
            peak_memory_mb=self.peak_memory_mb,
            run_id=run_id,
        )


class ValidateResult(BaseModel):
    """Output of the validate stage."""

    report: StageReport
    events_prefix: str
    quarantine_prefix: str
    quarantine_uri: str
    rows_read: int
    rows_valid: int
    rows_quarantined: int
    quarantine_reasons: dict[str, int] = Field(default_factory=dict)
    available_columns: list[str]
    first_event: dt.datetime | None
    last_event: dt.datetime | None
    event_time_ceiling: dt.datetime | None = Field(
        default=None, description="the latest event time accepted (later: event_time_in_future)"
    )


class FeaturesResult(BaseModel):
    """Output of the features stage."""

    report: StageReport
    as_of: dt.date
    horizon_days: int
    features: list[str]
    training_prefix: str
    scoring_prefix: str
    n_training: int
    n_scoring: int
    positive_rate: float
    events_after_as_of: int
    backtest_prefix: str | None = Field(
        default=None, description="examples at T-2H (and earlier origins), labels up to T-H"
    )
    n_backtest: int = 0
    backtest_positive_rate: float = 0.0
    backtest_skipped: str | None = Field(default=None, description="why there is no backtest")
    training_origins: list[dt.date] = Field(
        default_factory=list,
        description="the days of the training examples' origins, newest (T-H) first",
    )
    backtest_origins: list[dt.date] = Field(
        default_factory=list,
        description="the days of the backtest examples' origins, newest (T-2H) first",
    )
    sequence_length: int = Field(
        default=0, description="events per customer in the seq_* columns (0: none published)"
    )
    label_window_note: str | None = Field(
        default=None,
        description="with as_of after the last event: how much of the label window holds events",
    )


class PreprocessResult(BaseModel):
    """Output of the preprocess stage: the snapshot the GPU stage trains on (and the backtest's)."""

    report: StageReport
    snapshot_prefix: str
    split_counts: dict[str, int]
    features: list[str]
    data_fingerprint: str
    backtest_snapshot_prefix: str | None = None
    backtest_split_counts: dict[str, int] = Field(default_factory=dict)
    backtest_skipped: str | None = Field(default=None, description="why there is no backtest")


class TrainResult(BaseModel):
    """Output of the train stage: the version the gate decided on (the champion, or the run's
    ``rfm`` contender in its place when the baseline rule refused the champion), the decision
    and the leaderboard of every contender."""

    report: StageReport
    model_version: str
    family: str = "mlp"
    promoted: bool
    decision_reason: str
    production_version: str | None
    metrics: dict[str, float]
    n_train: int
    n_test: int
    epochs: int
    best_epoch: int
    training_id: str = ""
    warm_start: bool = False
    parent_version: str | None = None
    resumed_from_step: int | None = None
    steps: int = 0
    checkpoints_uri: str = ""
    evaluation: ModelEvaluation | None = None
    leaderboard: list[LeaderboardRow] = Field(
        default_factory=list, description="every contender, best first (the champion first)"
    )
    champion_reason: str = ""
    start_reason: str = Field(default="", description="warm start from production, or why not")


class StageReportOnly(BaseModel):
    """The report of any stage's manifest (what the summary and the cost report read of a
    contender unit's, without the torch-side records)."""

    report: StageReport


class InferenceResult(BaseModel):
    """Output of batch inference."""

    report: StageReport
    model_version: str
    predictions_prefix: str
    predictions_uri: str
    rows_scored: int
    model_loads: int | None = Field(
        default=0, description="Python workers that loaded the model (None: Spark Connect)"
    )
    torch_threads: int = Field(default=1, description="torch threads per Spark task")


def write_stage_manifest(store: ObjectStore, run_id: str, stage: str, result: BaseModel) -> None:
    """Publish a stage's result (atomically; last thing a stage does)."""
    store.put_bytes(stage_manifest_key(run_id, stage), result.model_dump_json(indent=2).encode())


def require_stage_manifest(store: ObjectStore, run_id: str, stage: str) -> None:
    """A user named a run whose ``stage`` should have finished: an input error (one line, no
    retry) when the store holds no such manifest."""
    key = stage_manifest_key(run_id, stage)
    if not store.exists(key):
        raise HybridflowInputError(
            f"no run {run_id!r} with a finished {stage} stage in the store "
            f"({store.key_uri(key)} not found): give a run id 'hybridflow features' or "
            "'hybridflow run' printed"
        )


def read_stage_manifest(store: ObjectStore, run_id: str, stage: str, model: type[M]) -> M:
    """The result a finished stage published; a clear error when it has not finished."""
    try:
        return model.model_validate_json(store.get_bytes(stage_manifest_key(run_id, stage)))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"stage {stage!r} of run {run_id} has no manifest at "
            f"{store.key_uri(stage_manifest_key(run_id, stage))}: run it first"
        ) from None


class PipelineSummary(BaseModel):
    """The run summary: printed by ``hybridflow run`` (one JSON line with ``--json``)."""

    status: str
    flow_run_id: str
    run_id: str
    as_of: dt.date
    horizon_days: int
    model_version: str
    promoted: bool
    promotion_reason: str
    scored_with: str
    metrics: dict[str, Any] = Field(
        description="test_* figures (calibrated), the out-of-time `backtest` report, the "
        "champion's `family`, why it won (`champion`) and every contender (`leaderboard`)"
    )
    predictions_uri: str
    quarantine_uri: str
    rows_read: int
    rows_quarantined: int
    quarantine_reasons: dict[str, int]
    rows_scored: int
    stages: list[StageReport]
    seconds: float
    startup_seconds: float | None = Field(
        default=None,
        description="the run's fixed cost: from the process's start (the pipeline's flow body "
        "outside the CLI) to its first stage's dispatch",
    )
    startup: dict[str, float] = Field(
        default_factory=dict,
        description="startup_seconds by step: interpreter, imports, prefect_api, "
        "pipeline_flow_run, planning (infra.startup)",
    )
    plan: list[dict[str, str]] = Field(default_factory=list)
    cost: dict[str, Any] = Field(default_factory=dict)
    drift: dict[str, Any] = Field(
        default_factory=dict, description="the drift check, the refresh decision, the events"
    )
