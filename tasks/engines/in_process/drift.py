"""The drift check's aggregates in this process: datasets read with pyarrow, exact quantiles
and bin counts by numpy (the binning rule Spark's :func:`tasks.data.drift.bin_counts` follows);
milliseconds where each Spark job costs a fraction of a second."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from infra.settings import DriftSettings
from infra.storage.arrow_datasets import read_table, write_table
from infra.storage.datasets import DatasetManifest
from infra.storage.store import ObjectStore
from tasks.data.stability import exact_quantile_edges, sample_bin_counts
from tasks.engines.drift_aggregator import (
    CUSTOMER,
    SCORE,
    BinCounts,
    Edges,
    SnapshotAggregates,
    plain_features,
)
from tasks.engines.scorer import scores_of_table
from tasks.ml.model_inputs import source_columns
from tasks.ml.scoring_worker import ScoringModel


class InProcessDriftAggregator:
    """The drift check's :class:`~tasks.engines.drift_aggregator.DriftAggregator` in this
    process."""

    def snapshot(
        self,
        store: ObjectStore,
        snapshot: DatasetManifest,
        model: ScoringModel,
        customers_prefix: str,
        settings: DriftSettings,
    ) -> SnapshotAggregates:
        """From one pyarrow read of the snapshot."""
        table = read_table(store, snapshot, [CUSTOMER, "split", *source_columns(model.features)])
        binned = plain_features(model.features)
        edges = {f: exact_quantile_edges(_values(table, f), settings.bins) for f in binned}
        customers = pa.table({CUSTOMER: pc.unique(table[CUSTOMER])})
        return SnapshotAggregates(
            edges=edges,
            counts=_table_bin_counts(table, edges),
            customers=write_table(customers, store, customers_prefix),
            scores=scores_of_table(table.filter(pc.equal(table["split"], "test")), model),
        )

    def features(
        self, store: ObjectStore, features: DatasetManifest, known: DatasetManifest, edges: Edges
    ) -> tuple[BinCounts, int]:
        table = read_table(store, features)
        edges = {f: e for f, e in edges.items() if f in table.column_names}
        ids = pc.unique(table[CUSTOMER].cast(pa.string()))
        seen = read_table(store, known, [CUSTOMER])[CUSTOMER].cast(pa.string())
        unseen = len(ids) - int(pc.sum(pc.is_in(ids, value_set=seen)).as_py() or 0)
        return _table_bin_counts(table, edges), unseen

    def scores(
        self, store: ObjectStore, predictions: DatasetManifest, edges: Sequence[float]
    ) -> dict[int, int]:
        return sample_bin_counts(_values(read_table(store, predictions, [SCORE]), SCORE), edges)


def _values(table: pa.Table, column: str) -> np.ndarray:
    """A column as doubles, as Spark casts it for binning; nulls become NaN (the null bin)."""
    return table.column(column).cast(pa.float64()).to_numpy()


def _table_bin_counts(table: pa.Table, edges: Edges) -> BinCounts:
    """Rows per bin of every column in ``edges``, binned as Spark's bin counts bin them."""
    return {f: sample_bin_counts(_values(table, f), edges[f]) for f in edges}
