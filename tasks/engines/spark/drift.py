"""The drift check's aggregates on Spark, for datasets too large to read in this process:
``percentile_approx`` edges, group-by bin counts, an anti-join for unseen customers
(:mod:`tasks.data.drift`); the session is started only when an aggregate is asked for."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from infra.compute.spark import SessionProvider
from infra.compute.spark_io import read_dataset, write_dataset
from infra.settings import DriftSettings
from infra.storage.datasets import DatasetManifest
from infra.storage.store import ObjectStore
from tasks.data.drift import bin_counts, quantile_edges, unseen_count
from tasks.engines.drift_aggregator import (
    CUSTOMER,
    SCORE,
    BinCounts,
    Edges,
    SnapshotAggregates,
    plain_features,
)
from tasks.engines.scorer import check_columns, scores_of_table
from tasks.ml.model_inputs import source_columns
from tasks.ml.scoring_worker import ScoringModel


class SparkDriftAggregator:
    """The drift check's :class:`~tasks.engines.drift_aggregator.DriftAggregator` on Spark."""

    def __init__(self, spark: SessionProvider) -> None:
        self._spark = spark

    def snapshot(
        self,
        store: ObjectStore,
        snapshot: DatasetManifest,
        model: ScoringModel,
        customers_prefix: str,
        settings: DriftSettings,
    ) -> SnapshotAggregates:
        frame = read_dataset(self._spark(), store, snapshot.prefix)
        binned = plain_features(model.features)
        edges = quantile_edges(frame, binned, settings.bins, settings.quantile_accuracy)
        customers = frame.select(CUSTOMER).distinct()
        return SnapshotAggregates(
            edges=edges,
            counts=bin_counts(frame, edges),
            customers=write_dataset(customers, store, customers_prefix),
            scores=scores_of_frame(frame.filter(F.col("split") == "test"), model),
        )

    def features(
        self, store: ObjectStore, features: DatasetManifest, known: DatasetManifest, edges: Edges
    ) -> tuple[BinCounts, int]:
        session = self._spark()
        frame = read_dataset(session, store, features.prefix)
        counts = bin_counts(frame, {f: e for f, e in edges.items() if f in frame.columns})
        return counts, unseen_count(frame, read_dataset(session, store, known.prefix))

    def scores(
        self, store: ObjectStore, predictions: DatasetManifest, edges: Sequence[float]
    ) -> dict[int, int]:
        frame = read_dataset(self._spark(), store, predictions.prefix)
        return bin_counts(frame, {SCORE: edges})[SCORE]


def scores_of_frame(features: DataFrame, model: ScoringModel) -> np.ndarray:
    """The model's calibrated score for every row of a small Spark DataFrame of features, by one
    collect and scoring in this process (no Python worker to start, no second pass to bin)."""
    check_columns(features.columns, model)
    return scores_of_table(features.select(*source_columns(model.features)).toArrow(), model)
