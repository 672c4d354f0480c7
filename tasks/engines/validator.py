"""What the validate stage asks of an engine: the contract's rules applied to the events input,
the run's good events and quarantine published, and the figures the stage reports
(:mod:`tasks.stages.validate` picks the engine once, with :mod:`tasks.data.engine_choice`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from infra.storage.datasets import DatasetManifest
from infra.storage.store import ObjectStore
from tasks.data.input_formats import EventsInput, InputOptions
from tasks.data.validation_sql import RowBounds


@dataclass(frozen=True)
class ValidatedOutputs:
    """One engine's published outputs and its figures: rows quarantined per reason, the
    contract's columns the input has, the first and last good event time (microseconds since
    the epoch, UTC) and the Spark jobs it ran (0 in process)."""

    events: DatasetManifest
    quarantine: DatasetManifest
    reasons: dict[str, int]
    present: list[str]
    span_micros: tuple[int | None, int | None]
    spark_jobs: int | None


class CsvNotReadInProcessError(Exception):
    """DuckDB's CSV reader refused a file Spark's permissive reader may still read (a row
    whose quotes never close, text that is not UTF-8): validate it with Spark instead."""


class Validator(Protocol):
    """An engine that validates an inspected events input (``found``) and publishes the run's
    good events and quarantine, event times within ``bounds`` when given."""

    def validate(
        self,
        store: ObjectStore,
        run_id: str,
        found: EventsInput,
        options: InputOptions,
        bounds: RowBounds | None,
    ) -> ValidatedOutputs: ...
