"""Batch scoring in Spark: ``mapInArrow`` with the model loaded once per Python worker.

The model travels inside the Spark task as its bundle bytes plus sha256s (tens of KB for this
MLP; Spark ships the serialized function once per stage, not once per row). Each Python worker
verifies and loads it once, caches it by checksum for the next tasks it runs
(``spark.python.worker.reuse``), and scores Arrow record batches of
``spark.sql.execution.arrow.maxRecordsPerBatch`` rows.

Threads: Spark runs one task per ``spark.task.cpus`` cores at once, each in its own Python
worker, so a task's torch uses ``spark.task.cpus`` threads (1 by default). Letting every worker
start one torch thread per core would oversubscribe the cores (measured 60x slower on a busy
2-core box); Spark's task parallelism is what fills the machine.

``mapInArrow`` rather than ``mapInPandas``: the features arrive as Arrow columns that turn into
one float32 matrix without pandas, and ``customer_id`` goes back out as the same Arrow array.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, DoubleType, StringType, StructField, StructType

from tasks.model import CONFIG_FILE, WEIGHTS_FILE

if TYPE_CHECKING:
    from pyspark import Accumulator

    from tasks.model import CustomerMLP

PREDICTION_SCHEMA = StructType(
    [
        StructField("customer_id", StringType(), False),
        StructField("score", DoubleType(), False),
        StructField("model_version", StringType(), False),
        StructField("as_of", DateType(), False),
    ]
)


@dataclass(frozen=True)
class ScoringModel:
    """A registry version as batch scoring needs it: bundle bytes, their sha256s, feature order."""

    version: str
    files: dict[str, bytes]
    sha256: dict[str, str]
    features: list[str]

    @property
    def cache_key(self) -> str:
        """Identity of the bundle: the checksums of its two files."""
        return f"{self.sha256.get(CONFIG_FILE, '')}:{self.sha256.get(WEIGHTS_FILE, '')}"


class _WorkerModelCache:
    """The model(s) a Python worker process has loaded, by checksum (most recent few kept)."""

    def __init__(self, capacity: int = 2) -> None:
        self.capacity = capacity
        self._models: dict[str, CustomerMLP] = {}
        self._lock = threading.Lock()
        self.loads = 0

    def get(self, model: ScoringModel) -> tuple[CustomerMLP, bool]:
        """The loaded model and whether this call loaded it (verifying sha256 first).

        Keyed by the manifest checksums: a cached model was verified against exactly those when
        it was loaded, so a hit needs no re-hashing and unverified bytes are never loaded.
        """
        from tasks.model import load_bundle

        key = model.cache_key
        with self._lock:
            cached = self._models.get(key)
            if cached is not None:
                return cached, False
            loaded = load_bundle(model.files, model.sha256)  # raises on a checksum mismatch
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


def worker_model(model: ScoringModel) -> tuple[CustomerMLP, bool]:
    """This process's cached model (a module-level function, so that cloudpickle ships it by
    reference and every task in a reused Python worker shares one cache)."""
    return WORKER_MODELS.get(model)


def feature_matrix(batch: pa.RecordBatch, features: list[str]) -> np.ndarray:
    """The batch's feature columns as one C-ordered float32 matrix; nulls and NaNs become 0."""
    x = np.empty((batch.num_rows, len(features)), dtype=np.float32)
    for j, name in enumerate(features):
        column = batch.column(name).to_numpy(zero_copy_only=False)
        x[:, j] = column
    np.nan_to_num(x, copy=False, nan=0.0, posinf=np.finfo(np.float32).max)
    return x


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
        names=[f.name for f in PREDICTION_SCHEMA.fields],
    )


def score_features(
    features: DataFrame,
    model: ScoringModel,
    as_of: dt.date,
    *,
    torch_threads: int = 1,
    rows_done: Accumulator[int] | None = None,
    model_loads: Accumulator[int] | None = None,
) -> DataFrame:
    """Predictions per the contract for every row of ``features`` (customer_id + raw features).

    ``rows_done`` / ``model_loads``: optional accumulators the workers add scored rows and model
    loads to (progress reporting, and proof that each worker loads the model once).
    """
    missing = [f for f in model.features if f not in features.columns]
    if "customer_id" not in features.columns:
        missing.insert(0, "customer_id")
    if missing:
        raise ValueError(f"features for scoring lack column(s) the model needs: {missing}")
    feature_order = list(model.features)
    version = model.version

    def score_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import torch

        from tasks.model import predict_proba

        torch.set_num_threads(torch_threads)
        loaded, fresh = worker_model(model)
        if fresh and model_loads is not None:
            model_loads.add(1)
        for batch in batches:
            scores = predict_proba(loaded, feature_matrix(batch, feature_order))
            if rows_done is not None:
                rows_done.add(batch.num_rows)
            yield prediction_batch(batch.column("customer_id"), scores, version, as_of)

    selected = features.select(
        F.col("customer_id").cast("string"), *[F.col(f).cast("double") for f in feature_order]
    )
    return selected.mapInArrow(score_batches, schema=PREDICTION_SCHEMA)


def torch_threads_per_task(task_cpus: str | None) -> int:
    """Torch threads for one Spark task: the cores Spark reserves for it (``spark.task.cpus``)."""
    try:
        return max(1, int(task_cpus or 1))
    except ValueError:
        return 1
