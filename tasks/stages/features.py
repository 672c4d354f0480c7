"""The features stage: training examples at T-H and its earlier origins, the backtest's examples
at T-2H and its earlier origins (when the history reaches back that far) and scoring features
at T, published from one pass over the events."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable

from pydantic import BaseModel
from pyspark.sql import SparkSession

from infra.compute.spark import SessionProvider, local_cores
from infra.compute.spark_io import (
    EVENTS_KEY,
    customer_clustered_files,
)
from infra.errors import HybridflowInputError
from infra.fingerprint import code_modules, code_version, stage_fingerprint
from infra.layout import backtest_examples_prefix, run_dataset_prefix, scoring_features_prefix
from infra.settings import HybridflowSettings, in_process_rows_or_default, settings_defaults
from infra.storage.datasets import DatasetManifest, SourceEvents, read_dataset_manifest
from infra.storage.stage_cache import load_cached, save_cached
from infra.storage.store import ObjectStore
from tasks.data.cutoffs import Origins, pipeline_cutoffs
from tasks.data.engine_choice import (
    EngineChoice,
    EngineInputs,
    choose_engine,
)
from tasks.data.event_types import event_type_counts
from tasks.data.time_windows import (
    check_labels,
    events_after_possible,
    history_too_short,
    label_window_note,
    resolve_as_of,
)
from tasks.definitions.feature_specs import feature_names
from tasks.engines import registry as engines
from tasks.engines.feature_frame import FeatureFrame, FeatureOutput
from tasks.reporting.records import FeaturesResult, StageReport, ValidateResult

log = logging.getLogger(__name__)


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
    as_of_grace_days: int | None = None,
) -> FeaturesResult:
    """Compute and publish training examples (features at each origin T-H-ks, labels in the
    horizon after it) and the scoring features at T, with each customer's last
    ``sequence_length`` events before the cutoff. ``as_of`` defaults to the date of the last
    valid event, ``origins``, ``sequence_length``, ``in_process_rows`` and ``as_of_grace_days`` to the
    declared settings (a flow passes its run's settings down). The same events
    generation, as-of, horizon, origins, sequence length and code reuse an earlier run's
    output. An ``as_of`` after the last event's day needs ``as_of_after_events`` (the result's
    ``label_window_note`` then says what the label window holds)."""
    as_of = resolve_as_of(validate, as_of, horizon_days, as_of_after_events, as_of_grace_days)
    note = label_window_note(validate, as_of, horizon_days)
    if note is not None:
        log.warning("%s", note)
    origins = origins or settings_origins(settings_defaults())
    if sequence_length is None:
        sequence_length = settings_defaults().sequence_length
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
    cutoffs = pipeline_cutoffs(
        as_of, horizon_days, origins or settings_origins(settings_defaults()), first
    )
    too_short = history_too_short(validated, cutoffs.backtest[0])
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
    choice = features_engine(spark, store, validated, in_process_rows_or_default(in_process_rows))
    log.info("features: %s (%s)", choice.engine, choice.reason)
    with feature_frame(
        spark, store, validated, outputs, in_process_rows, sequence_length, choice
    ) as frame:
        examples, positive_rate = _publish_training(
            frame, training, (as_of, horizon_days), lambda: event_type_counts(store, events)
        )
        scoring, _ = frame.publish(scoring_output)
        backtest = (
            BacktestExamples(skipped=too_short)
            if too_short
            else _publish_backtest(frame, backtest_output)
        )
        after = frame.events_after() if events_after_possible(validated, cutoffs.score) else 0
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


def settings_origins(settings: HybridflowSettings) -> Origins:
    """The training origins ``settings`` ask for."""
    return Origins(count=settings.training_origins, stride_days=settings.origin_stride_days)


def features_engine(
    spark: SparkSession | SessionProvider | None,
    store: ObjectStore,
    validated: ValidateResult,
    limit: int,
) -> EngineChoice:
    """The features stage's engine for the run's valid events (the one choice,
    :mod:`tasks.data.engine_choice`): their rows, whether they are clustered by customer and
    whether Spark runs on a cluster."""
    manifest = read_dataset_manifest(store, validated.events_prefix)
    clustered = customer_clustered_files(manifest, EVENTS_KEY) is not None
    # whether Spark runs on a cluster is asked only when Spark runs the stage anyway (the
    # question may start a session; in-process callers may pass no session at all)
    spark_runs = validated.rows_valid > limit and spark is not None
    inputs = EngineInputs(
        rows=validated.rows_valid,
        limit=limit,
        cluster=spark_runs and local_cores(spark) is None,
        clustered_by_customer=clustered,
    )
    return choose_engine("features", inputs)


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
    (:mod:`tasks.engines.spark.features_per_bucket`); ``spark-per-partition``, the events
    shuffled by customer and a Spark task per partition running DuckDB
    (:mod:`tasks.engines.spark.features_per_partition`); ``spark``, Spark SQL
    (:class:`tasks.engines.spark.features.SparkFeatureFrame`: what the stage ran for unclustered
    events until 3 Dec 2026; no rule chooses it now, ``bench cluster`` measures it as the
    before)."""
    choice = choice or features_engine(
        spark, store, validated, in_process_rows_or_default(in_process_rows)
    )
    return engines.feature_frame(
        choice.engine,
        spark,
        store,
        validated.events_prefix,
        outputs,
        set(validated.available_columns),
        sequence_length,
    )


def _publish_training(
    frame: FeatureFrame,
    training: FeatureOutput,
    run: tuple[dt.date, int],
    event_types: Callable[[], dict[str, int]],
) -> tuple[DatasetManifest, float]:
    """Write the training examples and check they can train a model (rows, both classes);
    ``run`` is the as-of date and horizon the errors name, ``event_types`` counts the events'
    types for the error of a log without purchases."""
    examples, positive_rate = frame.publish(training)
    if examples.rows == 0:
        raise HybridflowInputError(
            f"no customer has an event on or before {training.cutoffs[0].at.date()} "
            "(as_of - horizon)"
        )
    check_labels(positive_rate, examples.rows, *run, event_types)
    return examples, positive_rate


class BacktestExamples(BaseModel):
    """The backtest's training examples, or why there are none."""

    prefix: str | None = None
    rows: int = 0
    positive_rate: float = 0.0
    skipped: str | None = None


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
