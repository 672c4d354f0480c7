"""The features stage: training examples at T-H, the backtest's examples at T-2H (when the history
reaches back that far) and scoring features at T, published."""

from __future__ import annotations

import datetime as dt
import logging
import time

from pydantic import BaseModel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from infra.datasets import read_dataset_manifest
from infra.errors import HybridflowInputError
from infra.layout import backtest_examples_prefix, run_dataset_prefix, scoring_features_prefix
from infra.store import ObjectStore
from tasks.data.features import (
    backtest_cutoff,
    backtest_examples,
    customer_features,
    end_of_day,
    feature_names,
    training_examples,
)
from tasks.stages.cache import load_cached, save_cached
from tasks.stages.fingerprint import code_version, stage_fingerprint
from tasks.stages.records import FeaturesResult, StageReport, ValidateResult
from tasks.stages.spark_io import read_dataset, write_dataset

log = logging.getLogger(__name__)
FEATURES_CODE = (
    "tasks.data.features",
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
    """Compute and publish both feature sets for a resolved ``as_of``."""
    started = time.perf_counter()
    cutoff = end_of_day(as_of)
    training_cutoff = cutoff - dt.timedelta(days=horizon_days)
    available = set(validated.available_columns)
    events = read_dataset(spark, store, validated.events_prefix)
    after = events.filter(
        F.col("event_time") > F.lit(cutoff.isoformat(sep=" ")).cast("timestamp")
    ).count()
    if after:
        log.warning("ignoring %d event(s) after as_of %s (point-in-time features)", after, as_of)

    examples = write_dataset(
        training_examples(events, cutoff, horizon_days, available),
        store,
        run_dataset_prefix(run_id, "training_examples"),
    )
    if examples.rows == 0:
        raise HybridflowInputError(
            f"no customer has an event on or before {training_cutoff.date()} (as_of - horizon)"
        )
    label_stats = (
        read_dataset(spark, store, examples.prefix).agg(F.avg("label").alias("rate")).first()
    )
    positive_rate = float(label_stats["rate"]) if label_stats else 0.0
    check_labels(positive_rate, examples.rows, as_of, horizon_days)
    scoring = write_dataset(
        customer_features(events, cutoff, available), store, scoring_features_prefix(as_of)
    )
    backtest = build_backtest_examples(spark, store, run_id, events, validated, as_of, horizon_days)
    return FeaturesResult(
        report=StageReport(
            name="features",
            seconds=time.perf_counter() - started,
            rows_in=validated.rows_valid,
            rows_out=scoring.rows,
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


class BacktestExamples(BaseModel):
    """The backtest's training examples, or why there are none."""

    prefix: str | None = None
    rows: int = 0
    positive_rate: float = 0.0
    skipped: str | None = None


def build_backtest_examples(
    spark: SparkSession,
    store: ObjectStore,
    run_id: str,
    events: DataFrame,
    validated: ValidateResult,
    as_of: dt.date,
    horizon_days: int,
) -> BacktestExamples:
    """Publish the examples a run H days earlier would have trained on (features at T-2H,
    labels in (T-2H, T-H]); skipped, with the reason, when the history is too short for T-2H or
    those labels have a single class."""
    cutoff = backtest_cutoff(end_of_day(as_of), horizon_days)
    first = validated.first_event
    if first is None or cutoff.date() < first.date():
        reason = (
            f"history too short for the backtest: it would train at as_of - 2 x horizon = "
            f"{cutoff.date()}, before the first event ({first.date() if first else '-'})"
        )
        log.warning("%s", reason)
        return BacktestExamples(skipped=reason)
    examples = write_dataset(
        backtest_examples(
            events, end_of_day(as_of), horizon_days, set(validated.available_columns)
        ),
        store,
        backtest_examples_prefix(run_id),
    )
    row = read_dataset(spark, store, examples.prefix).agg(F.avg("label").alias("rate")).first()
    rate = float(row["rate"]) if row and row["rate"] is not None else 0.0
    if examples.rows == 0 or rate in (0.0, 1.0):
        reason = (
            f"no backtest: the {examples.rows} customers seen by {cutoff.date()} (as_of - 2 x "
            "horizon) have a single label class in the horizon after it"
        )
        log.warning("%s", reason)
        return BacktestExamples(skipped=reason)
    return BacktestExamples(prefix=examples.prefix, rows=examples.rows, positive_rate=rate)


def check_labels(positive_rate: float, n: int, as_of: dt.date, horizon_days: int) -> None:
    """Training needs both classes: a single class in the labels is an input error."""
    if positive_rate in (0.0, 1.0):
        raise HybridflowInputError(
            f"all {n} training labels are {int(positive_rate)} for as_of {as_of} and "
            f"horizon {horizon_days} days: the model needs both "
            "buyers and non-buyers (try another --as-of or --horizon-days)"
        )
