"""The batch-inference stage's scoring in this process: every file of the features scored by a
thread per core (pyarrow and torch release the GIL), the model loaded once; no Spark job, no
Python worker to start."""

from __future__ import annotations

import datetime as dt

from infra.progress import ProgressReporter
from infra.storage.datasets import DatasetManifest, new_data_prefix
from infra.storage.store import ObjectStore
from tasks.engines.scorer import (
    ROWS_PER_SCORING_TASK,
    Scored,
    score_in_threads,
    scoring_tasks,
    scoring_units,
)
from tasks.ml.scoring_worker import ScoringModel


class InProcessScorer:
    """The batch-inference stage's :class:`~tasks.engines.scorer.Scorer` in this process:
    ``cores`` threads at most, one per ~``ROWS_PER_SCORING_TASK`` rows, ``batch_rows`` rows
    at a time."""

    def __init__(self, cores: int, batch_rows: int) -> None:
        self._cores = cores
        self._batch_rows = batch_rows

    def score(
        self,
        store: ObjectStore,
        features: DatasetManifest,
        model: ScoringModel,
        as_of: dt.date,
        target_prefix: str,
        reporter: ProgressReporter,
    ) -> Scored:
        data_prefix = new_data_prefix(target_prefix)
        units = scoring_units(features, data_prefix)
        workers = max(
            1, min(scoring_tasks(units, features.rows, ROWS_PER_SCORING_TASK), self._cores)
        )
        loads = _Count()
        with reporter:
            rows = score_in_threads(
                store,
                units,
                model,
                as_of,
                self._batch_rows,
                _ReportedRows(reporter),
                loads,
                workers,
            )
        return Scored(
            data_prefix=data_prefix,
            keys=[unit.target_key for unit in units],
            rows=rows,
            model_loads=loads.value,
            spark_jobs=0,
        )


class _Count:
    """A tally read back as ``value`` (as a Spark accumulator is)."""

    def __init__(self) -> None:
        self.value = 0

    def add(self, term: int) -> None:
        self.value += term


class _ReportedRows:
    """A tally of scored rows that reports each new total."""

    def __init__(self, reporter: ProgressReporter) -> None:
        self._reporter = reporter
        self._done = 0

    def add(self, term: int) -> None:
        self._done += term
        self._reporter.update(self._done)
