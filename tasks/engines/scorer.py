"""What the batch-inference stage asks of an engine (:class:`Scorer`: every file of a features
dataset scored into prediction files), and the engine-neutral scoring of an Arrow table in this
process (:func:`scores_of_table`: the drift reference scores its snapshot's test split this way,
and the endpoint's parity tests)."""

from __future__ import annotations

import contextvars
import datetime as dt
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from infra.progress import ProgressReporter
from infra.storage.datasets import DatasetManifest
from infra.storage.store import ObjectStore
from tasks.ml.model_inputs import input_matrix, source_columns
from tasks.ml.models import predict_proba
from tasks.ml.scoring_worker import (
    ScoringModel,
    ScoringUnit,
    Tally,
    counted_worker_model,
    score_units,
    worker_model,
)

# Enough rows that a task's work outweighs starting its Python worker and importing torch.
ROWS_PER_SCORING_TASK = 250_000


@dataclass(frozen=True)
class Scored:
    """One engine's prediction files (unpublished: under ``data_prefix``), the rows scored, the
    model loads counted (None where they are not) and the Spark jobs it ran (0 in process)."""

    data_prefix: str
    keys: list[str]
    rows: int
    model_loads: int | None
    spark_jobs: int | None


class Scorer(Protocol):
    """An engine that scores every file of a features dataset with ``model`` into files under
    a fresh data folder of ``target_prefix``, reporting rows scored to ``reporter``."""

    def score(
        self,
        store: ObjectStore,
        features: DatasetManifest,
        model: ScoringModel,
        as_of: dt.date,
        target_prefix: str,
        reporter: ProgressReporter,
    ) -> Scored: ...


def scoring_units(features: DatasetManifest, data_prefix: str) -> list[ScoringUnit]:
    """One unit per file of ``features``, its predictions to a file under ``data_prefix``."""
    return [
        ScoringUnit(source_key=key, target_key=f"{data_prefix}/part-{i:05d}.parquet")
        for i, key in enumerate(features.files)
    ]


def scoring_tasks(units: list[ScoringUnit], rows: int, rows_per_task: int) -> int:
    """Tasks of about ``rows_per_task`` rows of whole files (at least one file each)."""
    return min(len(units), -(-rows // max(1, rows_per_task)))


class LockedTally:
    """A tally that threads add to one at a time."""

    def __init__(self, tally: Tally) -> None:
        self._tally = tally
        self._lock = threading.Lock()

    def add(self, term: int) -> None:
        with self._lock:
            self._tally.add(term)


def score_in_threads(
    store: ObjectStore,
    units: list[ScoringUnit],
    model: ScoringModel,
    as_of: dt.date,
    batch_rows: int,
    rows_done: Tally | None,
    model_loads: Tally | None,
    workers: int,
) -> int:
    """Score ``units`` in this process, ``workers`` threads at once (pyarrow and torch release
    the GIL), with the model loaded once; returns the rows scored."""
    counted_worker_model(model, model_loads)  # loaded once, before the threads share it
    tally = None if rows_done is None else LockedTally(rows_done)

    def score(share: list[ScoringUnit]) -> int:
        return sum(score_units(store, share, model, as_of, batch_rows, tally))

    # each thread runs in the caller's context: a progress sink publishes to the flow run's API
    caller = contextvars.copy_context()
    with ThreadPoolExecutor(workers) as pool:
        shares = [units[i::workers] for i in range(workers)]
        return sum(pool.map(lambda share: caller.copy().run(score, share), shares))


def scores_of_table(table: pa.Table, model: ScoringModel) -> np.ndarray:
    """The model's calibrated score for every row of an Arrow table of features."""
    check_columns(table.column_names, model)
    if table.num_rows == 0:
        return np.empty(0, dtype=np.float64)
    loaded, _ = worker_model(model)
    return predict_proba(loaded, input_matrix(table, list(model.features)))


def check_columns(columns: list[str], model: ScoringModel) -> None:
    missing = [f for f in source_columns(model.features) if f not in columns]
    if missing:
        raise ValueError(f"features for scoring lack column(s) the model needs: {missing}")
