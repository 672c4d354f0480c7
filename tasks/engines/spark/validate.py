"""The validate stage on Spark: the input read by Spark's readers, conformed, split into good
events and quarantine by the contract's SQL (:mod:`tasks.data.validation`), and both published
in one pass each over one shuffle, the good events clustered by customer (hash buckets): the
layout the features stage reads without shuffling them again."""

from __future__ import annotations

from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from infra.compute.spark import SessionProvider, session_of
from infra.compute.spark_io import (
    EVENTS_KEY,
    ClusteredLayout,
    SparkJobs,
    bucket_count,
    check_cluster_sees,
    write_observed,
)
from infra.errors import HybridflowInputError
from infra.layout import run_dataset_prefix
from infra.storage.datasets import DatasetManifest
from infra.storage.store import ObjectStore
from tasks.data.input_formats import EventsInput, InputOptions, read_events
from tasks.data.validation import ValidatedEvents, conform_events, split_valid_events
from tasks.data.validation_sql import RowBounds
from tasks.definitions.contract import CONTRACT_COLUMNS, QUARANTINE_REASONS
from tasks.engines.validator import ValidatedOutputs


class SparkValidator:
    """The validate stage's :class:`~tasks.engines.validator.Validator` on Spark (the session
    is started when it validates)."""

    def __init__(self, spark: SparkSession | SessionProvider) -> None:
        self._spark = spark

    def validate(
        self,
        store: ObjectStore,
        run_id: str,
        found: EventsInput,
        options: InputOptions,
        bounds: RowBounds | None,
    ) -> ValidatedOutputs:
        """Read the input (already inspected: ``found``), split good rows from bad and publish
        both; every figure (rows, per-reason counts, first and last event) is observed while
        the two outputs are written: two writes over one shuffle."""
        spark = session_of(self._spark)
        path = found.path
        check_cluster_sees(spark, "events", str(path))
        with SparkJobs(spark) as jobs:
            raw = read_events(spark, path, options, found)
            present = sorted(c for c in CONTRACT_COLUMNS if c in raw.df.columns)
            buckets = bucket_count(spark, raw.rows_estimate)
            conformed = conform_events(
                raw.df, raw.timestamp_format, raw.decimal_comma, options.purchase_event
            )
            try:
                parts = split_valid_events(conformed, buckets, bounds)
            except (PySparkException, Py4JJavaError) as exc:
                raise HybridflowInputError(
                    f"cannot read events at {path}: {_first_line(exc)}"
                ) from None
            try:
                events, span, quarantine, counted = _publish(parts, store, run_id)
            except (PySparkException, Py4JJavaError) as exc:
                raise HybridflowInputError(
                    f"cannot read events at {path}: {_first_line(exc)}"
                ) from None
            finally:
                parts.release()
        return ValidatedOutputs(
            events=events,
            quarantine=quarantine,
            reasons={r: int(counted[r]) for r in QUARANTINE_REASONS if counted.get(r)},
            present=present,
            span_micros=(span["first"], span["last"]),
            spark_jobs=jobs.count,
        )


def _publish(
    parts: ValidatedEvents, store: ObjectStore, run_id: str
) -> tuple[DatasetManifest, dict[str, Any], DatasetManifest, dict[str, Any]]:
    """Write the good events (bucketed by customer; first and last event time observed) and the
    quarantine (rows per reason observed)."""
    events, span = write_observed(
        parts.good,
        store,
        run_dataset_prefix(run_id, "events"),
        [
            F.min(F.unix_micros("event_time")).alias("first"),
            F.max(F.unix_micros("event_time")).alias("last"),
        ],
        layout=ClusteredLayout(EVENTS_KEY, parts.partitions),
    )
    quarantine, counted = write_observed(
        parts.quarantine,
        store,
        run_dataset_prefix(run_id, "quarantine"),
        [F.count(F.when(F.col("reason") == r, 1)).alias(r) for r in QUARANTINE_REASONS],
    )
    return events, span, quarantine, counted


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
