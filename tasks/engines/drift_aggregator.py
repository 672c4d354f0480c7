"""What the drift check asks of an engine: the aggregates of a version's training snapshot its
reference records, and the bin counts of the new scoring features and predictions
(:mod:`tasks.stages.drift` picks the engine once per check or reference, with
:mod:`tasks.data.engine_choice`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from infra.settings import DriftSettings
from infra.storage.datasets import DatasetManifest
from infra.storage.store import ObjectStore
from tasks.definitions.examples import split_element
from tasks.ml.scoring_worker import ScoringModel

CUSTOMER = "customer_id"
SCORE = "score"

Edges = Mapping[str, Sequence[float]]
BinCounts = dict[str, dict[int, int]]


@dataclass(frozen=True)
class SnapshotAggregates:
    """A training snapshot's quantile edges and bin counts per plain feature, its customers
    (published), and its test split's scores."""

    edges: dict[str, list[float]]
    counts: BinCounts
    customers: DatasetManifest
    scores: np.ndarray


class DriftAggregator(Protocol):
    """An engine that aggregates the drift check's datasets."""

    def snapshot(
        self,
        store: ObjectStore,
        snapshot: DatasetManifest,
        model: ScoringModel,
        customers_prefix: str,
        settings: DriftSettings,
    ) -> SnapshotAggregates:
        """The reference's aggregates of ``snapshot``; its customers published at
        ``customers_prefix``."""
        ...

    def features(
        self, store: ObjectStore, features: DatasetManifest, known: DatasetManifest, edges: Edges
    ) -> tuple[BinCounts, int]:
        """Bin counts of the columns ``edges`` names that ``features`` has, and how many of
        their customers ``known`` lacks."""
        ...

    def scores(
        self, store: ObjectStore, predictions: DatasetManifest, edges: Sequence[float]
    ) -> dict[int, int]:
        """Bin counts of the predictions' scores."""
        ...


def plain_features(inputs: list[str]) -> list[str]:
    """The model's inputs that are features (drift bins those, not sequence positions)."""
    return [f for f in inputs if split_element(f) is None]
