"""What the preprocess stage asks of an engine: the training examples split by customer (the
same split at every origin), the values the normaliser is fitted from observed, and the
snapshot published (:mod:`tasks.stages.preprocess` picks the engine once, with
:mod:`tasks.data.engine_choice`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from infra.storage.datasets import DatasetManifest
from infra.storage.store import ObjectStore

# the snapshot's manifest metadata from the observed values (split counts ``n_<split>``, the
# normaliser's sums, non-finite counts); it raises to publish nothing
Metadata = Callable[[dict[str, Any]], dict[str, Any]]


class SnapshotBuilder(Protocol):
    """An engine that splits and publishes examples; ``spark_jobs`` is the Spark jobs its
    publications ran so far (0 in process, None where Spark does not count them)."""

    spark_jobs: int | None

    def publish(
        self,
        store: ObjectStore,
        examples: DatasetManifest,
        out_prefix: str,
        features: list[str],
        seed: int,
        metadata: Metadata,
    ) -> tuple[DatasetManifest, dict[str, Any]]:
        """Split ``examples`` by customer (column ``split``), publish them at ``out_prefix``
        partitioned by split with ``metadata(values)``; the dataset and those values."""
        ...
