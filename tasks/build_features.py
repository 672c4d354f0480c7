"""The features stage: training examples at T-H and scoring features at T, published."""

from __future__ import annotations

import datetime as dt
import logging
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from infra.errors import HybridflowInputError
from infra.store import ObjectStore
from tasks.features import customer_features, end_of_day, feature_names, training_examples
from tasks.spark_io import read_dataset, write_dataset
from tasks.stage_records import FeaturesResult, StageReport, ValidateResult

log = logging.getLogger(__name__)


def scoring_features_prefix(as_of: dt.date) -> str:
    """Where the features to score (and serve) for an as-of date are published."""
    return f"features/as_of={as_of.isoformat()}"


def features_stage(
    spark: SparkSession,
    store: ObjectStore,
    run_id: str,
    validated: ValidateResult,
    as_of: dt.date | None,
    horizon_days: int,
) -> FeaturesResult:
    """Compute and publish training examples (features at T-H, labels in (T-H, T]) and the
    scoring features at T. ``as_of`` defaults to the date of the last valid event."""
    started = time.perf_counter()
    if validated.first_event is None or validated.last_event is None:
        raise HybridflowInputError("no valid events to compute features from")
    as_of = as_of or validated.last_event.date()
    first_day = validated.first_event.date()
    if as_of < first_day:
        raise HybridflowInputError(
            f"as_of {as_of} is before the first event ({first_day}): nothing to learn from"
        )
    cutoff = end_of_day(as_of)
    training_cutoff = cutoff - dt.timedelta(days=horizon_days)
    if training_cutoff.date() < first_day:
        raise HybridflowInputError(
            f"as_of {as_of} minus horizon {horizon_days} days is before the first event "
            f"({first_day}): no customer has an event in the training window"
        )
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
        f"runs/{run_id}/training_examples",
    )
    if examples.rows == 0:
        raise HybridflowInputError(
            f"no customer has an event on or before {training_cutoff.date()} (as_of - horizon)"
        )
    label_stats = (
        read_dataset(spark, store, examples.prefix).agg(F.avg("label").alias("rate")).first()
    )
    positive_rate = float(label_stats["rate"]) if label_stats else 0.0
    if positive_rate in (0.0, 1.0):
        raise HybridflowInputError(
            f"all {examples.rows} training labels are {int(positive_rate)} for as_of {as_of} "
            f"and horizon {horizon_days} days: the model needs both buyers and non-buyers"
        )
    scoring = write_dataset(
        customer_features(events, cutoff, available), store, scoring_features_prefix(as_of)
    )
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
    )
