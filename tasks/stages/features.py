"""The features stage: training examples at T-H and its earlier origins, the backtest's examples
at T-2H and its earlier origins (when the history reaches back that far) and scoring features
at T, published from one pass over the events."""

from __future__ import annotations

import datetime as dt
import logging
import time

from pydantic import BaseModel
from pyspark.sql import SparkSession

from infra.compute.spark import SessionProvider, session_of
from infra.compute.spark_io import (
    EVENTS_KEY,
    customer_clustered_files,
)
from infra.errors import HybridflowInputError
from infra.fingerprint import code_modules, code_version, stage_fingerprint
from infra.layout import backtest_examples_prefix, run_dataset_prefix, scoring_features_prefix
from infra.settings import get_settings, in_process_limit
from infra.storage.datasets import DatasetManifest, SourceEvents, read_dataset_manifest
from infra.storage.stage_cache import load_cached, save_cached
from infra.storage.store import ObjectStore
from tasks.data.cutoffs import Cutoff, Origins, end_of_day, pipeline_cutoffs
from tasks.data.engine_choice import (
    IN_PROCESS,
    SPARK_PER_BUCKET,
    EngineChoice,
    EngineInputs,
    choose_engine,
)
from tasks.definitions.feature_specs import feature_names
from tasks.engines.feature_frame import FeatureFrame, FeatureOutput
from tasks.engines.in_process.features import InProcessFeatureFrame
from tasks.engines.spark.features import SparkFeatureFrame
from tasks.engines.spark.features_per_bucket import BucketFeatureFrame
from tasks.reporting.records import FeaturesResult, StageReport, ValidateResult

log = logging.getLogger(__name__)


def resolve_as_of(
    validated: ValidateResult,
    as_of: dt.date | None,
    horizon_days: int,
    after_events: bool = False,
) -> dt.date:
    """T (default: the last valid event's date), checked against the span of the events: a T
    more than the ``as_of_grace_days`` setting after the last event's day needs
    ``after_events`` (its label window is cut short)."""
    if validated.first_event is None or validated.last_event is None:
        raise HybridflowInputError("no valid events to compute features from")
    as_of = as_of or validated.last_event.date()
    note = label_window_note(validated, as_of, horizon_days)
    grace = dt.timedelta(days=get_settings().as_of_grace_days)
    if note is not None and as_of > validated.last_event.date() + grace and not after_events:
        raise HybridflowInputError(f"{note}; pass --as-of-after-events to train on it anyway")
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


def label_window_note(validated: ValidateResult, as_of: dt.date, horizon_days: int) -> str | None:
    """What the label window (T-H, T] holds when T is after the last valid event's day (None
    otherwise): the days of it that have events, out of the horizon."""
    last = validated.last_event
    if last is None or as_of <= last.date():
        return None
    start = as_of - dt.timedelta(days=horizon_days)
    covered = max((last.date() - start).days, 0)
    return (
        f"as_of {as_of} is {(as_of - last.date()).days} day(s) after the last event "
        f"({last.date()}): the label window ({start}, {as_of}] holds events on {covered} of "
        f"its {horizon_days} days, so buyers after {last.date()} are labelled as non-buyers"
    )


def features_stage(
    spark: SparkSession | SessionProvider,
    store: ObjectStore,
    run_id: str,
    validate: ValidateResult,
    as_of: dt.date | None,
    horizon_days: int,
    use_cache: bool = True,
    in_process_rows: int | None = None,
    origins: Origins | None = None,
    sequence_length: int | None = None,
    as_of_after_events: bool = False,
) -> FeaturesResult:
    """Compute and publish training examples (features at each origin T-H-ks, labels in the
    horizon after it) and the scoring features at T, with each customer's last
    ``sequence_length`` events before the cutoff. ``as_of`` defaults to the date of the last
    valid event, ``origins`` and ``sequence_length`` to the settings. The same events
    generation, as-of, horizon, origins, sequence length and code reuse an earlier run's
    output. An ``as_of`` after the last event's day needs ``as_of_after_events`` (the result's
    ``label_window_note`` then says what the label window holds)."""
    as_of = resolve_as_of(validate, as_of, horizon_days, as_of_after_events)
    note = label_window_note(validate, as_of, horizon_days)
    if note is not None:
        log.warning("%s", note)
    origins = origins or settings_origins()
    if sequence_length is None:
        sequence_length = get_settings().sequence_length
    fingerprint = stage_fingerprint(
        "features",
        events=read_dataset_manifest(store, validate.events_prefix).data_prefix,
        columns=sorted(validate.available_columns),
        as_of=as_of.isoformat(),
        horizon_days=horizon_days,
        origins=origins.count,
        stride_days=origins.stride_days or horizon_days,
        sequence_length=sequence_length,
        code=code_version(*code_modules(__name__)),
    )
    result = load_cached(store, "features", fingerprint, FeaturesResult) if use_cache else None
    if result is None:
        result = build_features(
            spark,
            store,
            run_id,
            validate,
            as_of,
            horizon_days,
            in_process_rows=in_process_rows,
            origins=origins,
            sequence_length=sequence_length,
        )
        result = result.model_copy(update={"label_window_note": note})
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
    spark: SparkSession | SessionProvider,
    store: ObjectStore,
    run_id: str,
    validated: ValidateResult,
    as_of: dt.date,
    horizon_days: int,
    *,
    in_process_rows: int | None = None,
    origins: Origins | None = None,
    sequence_length: int = 0,
) -> FeaturesResult:
    """Compute and publish the feature sets for a resolved ``as_of`` (with ``sequence_length``
    events per customer and cutoff: :mod:`tasks.data.sequences`).

    One pass over the events gives the features at every cutoff (every origin of the training
    and the backtest, and T) and the labels in one customer-level table, which each output is
    then selected from (:func:`feature_frame`).
    """
    started = time.perf_counter()
    first = validated.first_event.date() if validated.first_event else None
    cutoffs = pipeline_cutoffs(as_of, horizon_days, origins or settings_origins(), first)
    too_short = _history_too_short(validated, cutoffs.backtest[0])
    training = FeatureOutput(cutoffs.train, run_dataset_prefix(run_id, "training_examples"))
    events = read_dataset_manifest(store, validated.events_prefix)
    source = SourceEvents(
        events_prefix=events.prefix,
        events_data_prefix=events.data_prefix,
        cutoff_micros=cutoffs.score.micros(),
    )
    scoring_output = FeatureOutput((cutoffs.score,), scoring_features_prefix(as_of, run_id), source)
    backtest_output = FeatureOutput(cutoffs.backtest, backtest_examples_prefix(run_id))
    outputs = [training, scoring_output] + ([] if too_short else [backtest_output])
    choice = features_engine(store, validated, in_process_limit(in_process_rows))
    log.info("features: %s (%s)", choice.engine, choice.reason)
    with feature_frame(
        spark, store, validated, outputs, in_process_rows, sequence_length, choice
    ) as frame:
        examples, positive_rate = _publish_training(frame, training, (as_of, horizon_days))
        scoring, _ = frame.publish(scoring_output)
        backtest = (
            BacktestExamples(skipped=too_short)
            if too_short
            else _publish_backtest(frame, backtest_output)
        )
        after = frame.events_after() if _events_after_possible(validated, cutoffs.score) else 0
    if after:
        log.warning("ignoring %d event(s) after as_of %s (point-in-time features)", after, as_of)
    return FeaturesResult(
        report=StageReport(
            name="features",
            seconds=time.perf_counter() - started,
            rows_in=validated.rows_valid,
            rows_out=scoring.rows,
            spark_jobs=frame.spark_jobs,
        ).with_engine(choice),
        as_of=as_of,
        horizon_days=horizon_days,
        features=feature_names(set(validated.available_columns)),
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
        training_origins=[c.origin() for c in cutoffs.train],
        backtest_origins=[] if backtest.prefix is None else [c.origin() for c in cutoffs.backtest],
        sequence_length=sequence_length,
    )


def settings_origins() -> Origins:
    """The training origins the settings ask for."""
    settings = get_settings()
    return Origins(count=settings.training_origins, stride_days=settings.origin_stride_days)


def features_engine(store: ObjectStore, validated: ValidateResult, limit: int) -> EngineChoice:
    """The features stage's engine for the run's valid events (the one choice,
    :mod:`tasks.data.engine_choice`): their rows, and whether they are clustered by customer."""
    manifest = read_dataset_manifest(store, validated.events_prefix)
    clustered = customer_clustered_files(manifest, EVENTS_KEY) is not None
    return choose_engine(
        "features",
        EngineInputs(rows=validated.rows_valid, limit=limit, clustered_by_customer=clustered),
    )


def feature_frame(
    spark: SparkSession | SessionProvider,
    store: ObjectStore,
    validated: ValidateResult,
    outputs: list[FeatureOutput],
    in_process_rows: int | None,
    sequence_length: int = 0,
    choice: EngineChoice | None = None,
) -> FeatureFrame:
    """The frame of the engine chosen for the run's events (``choice``, else chosen here with
    ``in_process_rows``, default: the setting): ``in-process``, DuckDB in this process
    (:mod:`tasks.engines.in_process.features`); ``spark-per-bucket``, a Spark task per bucket
    of the events clustered by customer, each running DuckDB
    (:mod:`tasks.engines.spark.features_per_bucket`); ``spark``, Spark SQL (:class:`SparkFeatureFrame`)."""
    choice = choice or features_engine(store, validated, in_process_limit(in_process_rows))
    available = set(validated.available_columns)
    if choice.engine == IN_PROCESS:
        return InProcessFeatureFrame(
            store, validated.events_prefix, outputs, available, sequence_length
        )
    session = session_of(spark)
    if choice.engine == SPARK_PER_BUCKET:
        manifest = read_dataset_manifest(store, validated.events_prefix)
        buckets = customer_clustered_files(manifest, EVENTS_KEY)
        assert buckets is not None  # what the choice saw
        return BucketFeatureFrame(session, store, buckets, outputs, available, sequence_length)
    return SparkFeatureFrame(
        session, store, validated.events_prefix, outputs, available, sequence_length
    )


def _publish_training(
    frame: FeatureFrame, training: FeatureOutput, run: tuple[dt.date, int]
) -> tuple[DatasetManifest, float]:
    """Write the training examples and check they can train a model (rows, both classes);
    ``run`` is the as-of date and horizon the errors name."""
    examples, positive_rate = frame.publish(training)
    if examples.rows == 0:
        raise HybridflowInputError(
            f"no customer has an event on or before {training.cutoffs[0].at.date()} "
            "(as_of - horizon)"
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


def _publish_backtest(frame: FeatureFrame, backtest: FeatureOutput) -> BacktestExamples:
    """Publish the examples a run H days earlier would have trained on (features at T-2H and
    its earlier origins, labels up to T-H); skipped, with the reason, when those labels have a
    single class."""
    examples, rate = frame.publish(backtest)
    if examples.rows == 0 or rate in (0.0, 1.0):
        reason = (
            f"no backtest: the {examples.rows} examples at {backtest.cutoffs[0].at.date()} "
            "(as_of - 2 x horizon) and its earlier origins have a single label class in the "
            "horizon after their origins"
        )
        log.warning("%s", reason)
        return BacktestExamples(skipped=reason)
    return BacktestExamples(prefix=examples.prefix, rows=examples.rows, positive_rate=rate)


def _events_after_possible(validated: ValidateResult, score: Cutoff) -> bool:
    """Whether the last valid event is after T (else there is nothing to count)."""
    last = validated.last_event
    return last is not None and last.astimezone(dt.UTC).replace(tzinfo=None) > score.at


def check_labels(positive_rate: float, n: int, as_of: dt.date, horizon_days: int) -> None:
    """Training needs both classes: a single class in the labels is an input error."""
    if positive_rate in (0.0, 1.0):
        raise HybridflowInputError(
            f"all {n} training labels are {int(positive_rate)} for as_of {as_of} and "
            f"horizon {horizon_days} days: the model needs both "
            "buyers and non-buyers (try another --as-of or --horizon-days)"
        )
