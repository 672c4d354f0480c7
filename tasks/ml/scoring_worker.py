"""Batch scoring inside a Spark Python worker: one task scores one file of features.

Spark only schedules the work (:func:`tasks.engines.spark.scoring.score_dataset`): each task
gets a :class:`ScoringUnit`, reads that Parquet file from the store with pyarrow, scores it
batch by batch and writes its predictions file back into the store. No feature row crosses the
JVM/Python bridge, and nothing is read from the driver's disk, so executors on other machines
work the same as local ones.

The model travels inside the Spark task as its bundle bytes plus sha256s (tens of KB for the
default families; Spark ships the serialized function once per stage, not once per row). Each
Python worker verifies and loads it once, through the family its bundle names
(:func:`tasks.ml.models.load_model`), and caches it by checksum for the next tasks it runs
(``spark.python.worker.reuse``).

Threads: Spark runs one task per ``spark.task.cpus`` cores at once, each in its own Python
worker, so a task's torch uses ``spark.task.cpus`` threads (1 by default). Letting every worker
start one torch thread per core would oversubscribe the cores (measured 60x slower on a busy
2-core box); Spark's task parallelism is what fills the machine.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from infra.storage.store import ObjectStore
from tasks.ml.model_inputs import input_matrix, source_columns

if TYPE_CHECKING:
    from tasks.ml.models import FittedModel

PREDICTION_COLUMNS = ("customer_id", "score", "model_version", "as_of")
PREDICTION_ARROW_SCHEMA = pa.schema(
    [
        pa.field("customer_id", pa.string(), nullable=False),
        pa.field("score", pa.float64(), nullable=False),
        pa.field("model_version", pa.string(), nullable=False),
        pa.field("as_of", pa.date32(), nullable=False),
    ]
)
SCORING_BATCH_ROWS = 10_000  # default; the stage passes HYBRIDFLOW_SPARK_ARROW_BATCH_SIZE


@dataclass(frozen=True)
class ScoringModel:
    """A registry version as batch scoring needs it: bundle bytes, their sha256s, feature order."""

    version: str
    files: dict[str, bytes]
    sha256: dict[str, str]
    features: list[str]

    @property
    def cache_key(self) -> str:
        """Identity of the bundle: the checksums of its files."""
        return ":".join(f"{name}={digest}" for name, digest in sorted(self.sha256.items()))


class _WorkerModelCache:
    """The model(s) a Python worker process has loaded, by checksum (most recent few kept)."""

    def __init__(self, capacity: int = 2) -> None:
        self.capacity = capacity
        self._models: dict[str, FittedModel] = {}
        self._lock = threading.Lock()
        self.loads = 0

    def get(self, model: ScoringModel) -> tuple[FittedModel, bool]:
        """The loaded model and whether this call loaded it (verifying sha256 first).

        Keyed by the manifest checksums: a cached model was verified against exactly those when
        it was loaded, so a hit needs no re-hashing and unverified bytes are never loaded.
        """
        from tasks.ml.models import load_model

        key = model.cache_key
        with self._lock:
            cached = self._models.get(key)
            if cached is not None:
                return cached, False
            loaded = load_model(model.files, model.sha256)  # raises on a checksum mismatch
            while len(self._models) >= self.capacity:
                self._models.pop(next(iter(self._models)))
            self._models[key] = loaded
            self.loads += 1
            return loaded, True

    def clear(self) -> None:
        """Forget every model (tests)."""
        with self._lock:
            self._models.clear()


WORKER_MODELS = _WorkerModelCache()


def worker_model(model: ScoringModel) -> tuple[FittedModel, bool]:
    """This process's cached model (a module-level function, so that cloudpickle ships it by
    reference and every task in a reused Python worker shares one cache)."""
    return WORKER_MODELS.get(model)


def feature_matrix(batch: pa.RecordBatch, features: list[str]) -> np.ndarray:
    """The batch's model inputs (feature columns, sequence positions) as one C-ordered float32
    matrix; nulls and NaNs become 0 (:func:`tasks.ml.model_inputs.input_matrix`)."""
    return input_matrix(batch, features)


def prediction_batch(
    customer_ids: pa.Array, scores: np.ndarray, model_version: str, as_of: dt.date
) -> pa.RecordBatch:
    """One Arrow batch in the predictions contract."""
    n = len(scores)
    return pa.RecordBatch.from_arrays(
        [
            customer_ids.cast(pa.string()),
            pa.array(scores, type=pa.float64()),
            pa.repeat(pa.scalar(model_version, pa.string()), n),
            pa.repeat(pa.scalar(as_of, pa.date32()), n),
        ],
        schema=PREDICTION_ARROW_SCHEMA,
    )


@dataclass(frozen=True)
class ScoringUnit:
    """One Spark task's work: the features file to score and the key of its predictions."""

    source_key: str
    target_key: str


class Tally(Protocol):
    """What counts scored rows and model loads: a Spark accumulator (or anything with ``add``)."""

    def add(self, term: int) -> None: ...


def counted_worker_model(model: ScoringModel, model_loads: Tally | None) -> FittedModel:
    """This process's cached model; a fresh load adds 1 to ``model_loads``."""
    loaded, fresh = worker_model(model)
    if fresh and model_loads is not None:
        model_loads.add(1)
    return loaded


def score_units(
    store: ObjectStore,
    units: Iterable[ScoringUnit],
    model: ScoringModel,
    as_of: dt.date,
    batch_rows: int = SCORING_BATCH_ROWS,
    rows_done: Tally | None = None,
    model_loads: Tally | None = None,
) -> Iterator[int]:
    """Score ``units`` one after another with this process's cached model (a fresh load adds 1
    to ``model_loads``); yields each unit's rows, added to ``rows_done`` as it goes. A Spark
    task runs it in its Python worker; a local dataset of one task's worth, in the driver."""
    loaded = counted_worker_model(model, model_loads)
    for unit in units:
        rows = score_unit(store, unit, model, loaded, as_of, batch_rows)
        if rows_done is not None:
            rows_done.add(rows)
        yield rows


def score_unit(
    store: ObjectStore,
    unit: ScoringUnit,
    model: ScoringModel,
    loaded: FittedModel,
    as_of: dt.date,
    batch_rows: int = SCORING_BATCH_ROWS,
) -> int:
    """Score the features file of ``unit`` with ``loaded`` and put its predictions file in the
    store; returns the rows scored. A file that lacks a feature the model needs is an error."""
    from tasks.ml.models import predict_proba

    local = store.local_path(unit.source_key)
    source = pq.ParquetFile(
        str(local) if local is not None else pa.BufferReader(store.get_bytes(unit.source_key))
    )
    names = set(source.schema_arrow.names)
    columns = source_columns(["customer_id", *model.features])
    missing = [c for c in columns if c not in names]
    if missing:
        raise ValueError(f"features for scoring lack column(s) the model needs: {missing}")
    sink = pa.BufferOutputStream()
    rows = 0
    with pq.ParquetWriter(sink, PREDICTION_ARROW_SCHEMA, compression="snappy") as writer:
        for batch in source.iter_batches(batch_size=batch_rows, columns=columns, use_threads=False):
            scores = predict_proba(loaded, feature_matrix(batch, model.features))
            writer.write_batch(
                prediction_batch(batch.column("customer_id"), scores, model.version, as_of)
            )
            rows += batch.num_rows
    store.put_bytes(unit.target_key, sink.getvalue().to_pybytes())
    return rows


def torch_threads_per_task(task_cpus: str | None) -> int:
    """Torch threads for one Spark task: the cores Spark reserves for it (``spark.task.cpus``)."""
    try:
        return max(1, int(task_cpus or 1))
    except ValueError:
        return 1
