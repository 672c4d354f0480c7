"""The features stage: training examples at T-H, the backtest's examples at T-2H (when the history
reaches back that far) and scoring features at T, published from one pass over the events."""

from __future__ import annotations

import datetime as dt
import logging
import time

from pydantic import BaseModel
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from infra.datasets import DatasetManifest, read_dataset_manifest
from infra.errors import HybridflowInputError
from infra.layout import backtest_examples_prefix, run_dataset_prefix, scoring_features_prefix
from infra.store import ObjectStore
from tasks.data.feature_specs import feature_names
from tasks.data.features import (
    Cutoff,
    customer_features_at,
    cutoff_features,
    end_of_day,
    pipeline_cutoffs,
)
from tasks.stages.cache import load_cached, save_cached
from tasks.stages.fingerprint import code_version, stage_fingerprint
from tasks.stages.records import FeaturesResult, StageReport, ValidateResult
from tasks.stages.spark_io import SparkJobs, read_dataset, write_dataset, write_observed

log = logging.getLogger(__name__)
FEATURES_CODE = (
    "tasks.data.features",
    "tasks.data.feature_specs",
    "tasks.stages.features",
    "tasks.stages.spark_io",
    "infra.datasets",
)


def resolve_as_of(validated: ValidateResult, as_of: dt.date | None, horizon_days: int) -> dt.date:
    """T (default: the last valid event's date), checked against the span of the events."""
    if validated.first_event is None or validated.last_event is None:
        raise HybridflowInputError("no valid events to compute features from")
    as_of = as_of or validated.last_event.date()
    first_day = validated.first_event.date()
    if as_of < first_day:
        raise HybridflowInputError(
            f"as_of {as_of} is before the first event ({first_day}): nothing to learn from"
        )
    training_cutoff = end_of_day(as_of) - dt.timedelta(days=horizon_days)
    if training_cutoff.date() < first_day:
        raise HybridflowInputError(
            f"as_of {as_of} minus horizon {horizon_days} days is before the first event "
            f"({first_day}): no customer has an event in the training window"
        )
    return as_of


def features_stage(
    spark: SparkSession,
    store: ObjectStore,
    run_id: str,
    validated: ValidateResult,
    as_of: dt.date | None,
    horizon_days: int,
    use_cache: bool = True,
) -> FeaturesResult:
    """Compute and publish training examples (features at T-H, labels in (T-H, T]) and the
    scoring features at T. ``as_of`` defaults to the date of the last valid event. The same
    events generation, as-of, horizon and code reuse an earlier run's output."""
    as_of = resolve_as_of(validated, as_of, horizon_days)
    fingerprint = stage_fingerprint(
        "features",
        events=read_dataset_manifest(store, validated.events_prefix).data_prefix,
        columns=sorted(validated.available_columns),
        as_of=as_of.isoformat(),
        horizon_days=horizon_days,
        code=code_version(*FEATURES_CODE),
    )
    result = load_cached(store, "features", fingerprint, FeaturesResult) if use_cache else None
    if result is None:
        result = build_features(spark, store, run_id, validated, as_of, horizon_days)
        save_cached(
            store,
            "features",
            fingerprint,
            run_id,
            result,
            [result.training_prefix, result.scoring_prefix]
            + ([result.backtest_prefix] if result.backtest_prefix else []),
        )
    return result


def build_features(
    spark: SparkSession,
    store: ObjectStore,
    run_id: str,
    validated: ValidateResult,
    as_of: dt.date,
    horizon_days: int,
) -> FeaturesResult:
    """Compute and publish the feature sets for a resolved ``as_of``.

    One pass over the events (clustered by customer by the validate stage: no shuffle) gives
    the features at every cutoff and the labels in one customer-level frame, kept in memory
    while each output is written from it; counts and the label rates are observed by the writes.
    """
    started = time.perf_counter()
    cutoffs = pipeline_cutoffs(as_of, horizon_days)
    too_short = _history_too_short(validated, cutoffs.backtest)
    wanted = [cutoffs.train, cutoffs.score] + ([] if too_short else [cutoffs.backtest])
    available = set(validated.available_columns)
    with SparkJobs(spark) as jobs:
        events = read_dataset(spark, store, validated.events_prefix)
        wide = customer_features_at(events, wanted, available).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            examples, positive_rate = _publish_training(
                wide, cutoffs.train, store, run_id, available, (as_of, horizon_days)
            )
            scoring = write_dataset(
                cutoff_features(wide, cutoffs.score, available),
                store,
                scoring_features_prefix(as_of),
            )
            backtest = (
                BacktestExamples(skipped=too_short)
                if too_short
                else _publish_backtest(wide, cutoffs.backtest, store, run_id, available)
            )
            after = _events_after(wide, validated, cutoffs.score)
        finally:
            wide.unpersist()
    if after:
        log.warning("ignoring %d event(s) after as_of %s (point-in-time features)", after, as_of)
    return FeaturesResult(
        report=StageReport(
            name="features",
            seconds=time.perf_counter() - started,
            rows_in=validated.rows_valid,
            rows_out=scoring.rows,
            spark_jobs=jobs.count,
        ),
        as_of=as_of,
        horizon_days=horizon_days,
        features=feature_names(available),
        training_prefix=examples.prefix,
        scoring_prefix=scoring.prefix,
        n_training=examples.rows,
        n_scoring=scoring.rows,
        positive_rate=positive_rate,
        events_after_as_of=after,
        backtest_prefix=backtest.prefix,
        n_backtest=backtest.rows,
        backtest_positive_rate=backtest.positive_rate,
        backtest_skipped=backtest.skipped,
    )


def _publish_labelled(
    wide: DataFrame, cutoff: Cutoff, store: ObjectStore, prefix: str, available: set[str]
) -> tuple[DatasetManifest, float]:
    """Write the examples of a labelled cutoff; their label rate is observed by the write."""
    examples, observed = write_observed(
        cutoff_features(wide, cutoff, available), store, prefix, [F.sum("label").alias("positives")]
    )
    rate = float(observed["positives"]) / examples.rows if examples.rows else 0.0
    return examples, rate


def _publish_training(
    wide: DataFrame,
    train: Cutoff,
    store: ObjectStore,
    run_id: str,
    available: set[str],
    run: tuple[dt.date, int],
) -> tuple[DatasetManifest, float]:
    """Write the training examples and check they can train a model (rows, both classes);
    ``run`` is the as-of date and horizon the errors name."""
    prefix = run_dataset_prefix(run_id, "training_examples")
    examples, positive_rate = _publish_labelled(wide, train, store, prefix, available)
    if examples.rows == 0:
        raise HybridflowInputError(
            f"no customer has an event on or before {train.at.date()} (as_of - horizon)"
        )
    check_labels(positive_rate, examples.rows, *run)
    return examples, positive_rate


class BacktestExamples(BaseModel):
    """The backtest's training examples, or why there are none."""

    prefix: str | None = None
    rows: int = 0
    positive_rate: float = 0.0
    skipped: str | None = None


def _history_too_short(validated: ValidateResult, backtest: Cutoff) -> str | None:
    """Why there is no backtest when its cutoff T-2H is before the first event (else None)."""
    first = validated.first_event
    if first is not None and backtest.at.date() >= first.date():
        return None
    reason = (
        f"history too short for the backtest: it would train at as_of - 2 x horizon = "
        f"{backtest.at.date()}, before the first event ({first.date() if first else '-'})"
    )
    log.warning("%s", reason)
    return reason


def _publish_backtest(
    wide: DataFrame, backtest: Cutoff, store: ObjectStore, run_id: str, available: set[str]
) -> BacktestExamples:
    """Publish the examples a run H days earlier would have trained on (features at T-2H,
    labels in (T-2H, T-H]); skipped, with the reason, when those labels have a single class."""
    examples, rate = _publish_labelled(
        wide, backtest, store, backtest_examples_prefix(run_id), available
    )
    if examples.rows == 0 or rate in (0.0, 1.0):
        reason = (
            f"no backtest: the {examples.rows} customers seen by {backtest.at.date()} (as_of - 2 x "
            "horizon) have a single label class in the horizon after it"
        )
        log.warning("%s", reason)
        return BacktestExamples(skipped=reason)
    return BacktestExamples(prefix=examples.prefix, rows=examples.rows, positive_rate=rate)


def _events_after(wide: DataFrame, validated: ValidateResult, score: Cutoff) -> int:
    """Events after T: none when the last valid event is not after it (no job), else summed
    over the customers already in memory."""
    last = validated.last_event
    if last is None or last.astimezone(dt.UTC).replace(tzinfo=None) <= score.at:
        return 0
    row = wide.agg(F.sum("events_after").alias("n")).first()
    return int(row["n"] or 0) if row else 0


def check_labels(positive_rate: float, n: int, as_of: dt.date, horizon_days: int) -> None:
    """Training needs both classes: a single class in the labels is an input error."""
    if positive_rate in (0.0, 1.0):
        raise HybridflowInputError(
            f"all {n} training labels are {int(positive_rate)} for as_of {as_of} and "
            f"horizon {horizon_days} days: the model needs both "
            "buyers and non-buyers (try another --as-of or --horizon-days)"
        )
