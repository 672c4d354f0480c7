"""Batch scoring inside a Spark Python worker: the model loaded once per worker process.

The model travels inside the Spark task as its bundle bytes plus sha256s (tens of KB for this
MLP; Spark ships the serialized function once per stage, not once per row). Each Python worker
verifies and loads it once, caches it by checksum for the next tasks it runs
(``spark.python.worker.reuse``), and turns Arrow record batches into prediction batches.
No Spark here: the ``mapInArrow`` wiring is :func:`tasks.stages.batch_inference.score_features`.

Threads: Spark runs one task per ``spark.task.cpus`` cores at once, each in its own Python
worker, so a task's torch uses ``spark.task.cpus`` threads (1 by default). Letting every worker
start one torch thread per core would oversubscribe the cores (measured 60x slower on a busy
2-core box); Spark's task parallelism is what fills the machine.
"""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from tasks.ml.model import CONFIG_FILE, WEIGHTS_FILE

if TYPE_CHECKING:
    from tasks.ml.model import CustomerMLP

PREDICTION_COLUMNS = ("customer_id", "score", "model_version", "as_of")


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
        from tasks.ml.model import load_bundle

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
        names=list(PREDICTION_COLUMNS),
    )


def torch_threads_per_task(task_cpus: str | None) -> int:
    """Torch threads for one Spark task: the cores Spark reserves for it (``spark.task.cpus``)."""
    try:
        return max(1, int(task_cpus or 1))
    except ValueError:
        return 1
