"""The newest scoring-feature snapshot, held in memory for lookups by ``customer_id``.

The features stage publishes one dataset per as-of date at ``features/as_of=YYYY-MM-DD/``; the
newest date wins. The whole snapshot is loaded into one float32 matrix plus a dict from
customer id to row: about ``rows * (4 * columns + 100)`` bytes, fine for up to a few million
customers.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads

from infra.datasets import (
    DatasetManifest,
    SourceEvents,
    find_dataset,
    local_dataset_dir,
    release_local_dir,
)
from infra.errors import StoreError
from infra.layout import (
    FEATURES,
    dataset_manifest_key,
    scoring_features_date,
    scoring_features_prefix,
)
from infra.store import ObjectStore


@dataclass(frozen=True)
class FeatureSnapshot:
    """Raw feature values per customer at one as-of date."""

    as_of: dt.date
    data_prefix: str
    columns: tuple[str, ...]
    values: np.ndarray  # float32, rows x columns; nulls stored as 0.0 like batch scoring
    row_of: dict[str, int]
    source: SourceEvents | None = None  # the events it was computed from (online state seed)

    @property
    def rows(self) -> int:
        return len(self.row_of)

    def column_indices(self, features: list[str] | tuple[str, ...]) -> np.ndarray:
        """Positions of ``features`` in :attr:`columns`; KeyError naming the first missing one."""
        position = {c: i for i, c in enumerate(self.columns)}
        missing = [f for f in features if f not in position]
        if missing:
            raise KeyError(", ".join(missing))
        return np.asarray([position[f] for f in features], dtype=np.intp)


def newest_snapshot_manifest(store: ObjectStore) -> DatasetManifest | None:
    """The manifest of the newest published scoring-feature dataset, or None."""
    dates = sorted(d for key in store.list(FEATURES) if (d := scoring_features_date(key)))
    for as_of in reversed(dates):
        manifest = find_dataset(store, scoring_features_prefix(as_of))
        if manifest is not None:
            return manifest
    return None


def load_snapshot(store: ObjectStore, manifest: DatasetManifest) -> FeatureSnapshot:
    """Read a published scoring-feature dataset into memory."""
    as_of = scoring_features_date(dataset_manifest_key(manifest.prefix))
    if as_of is None:
        raise StoreError(f"{manifest.prefix} is not a scoring-feature dataset")
    local = local_dataset_dir(store, manifest)
    try:
        table = pads.dataset(str(local), format="parquet").to_table()
    finally:
        release_local_dir(store, local)
    if "customer_id" not in table.column_names:
        raise StoreError(f"feature snapshot {manifest.prefix} has no customer_id column")
    numeric = [
        name
        for name, typ in zip(table.column_names, table.schema.types, strict=True)
        if name != "customer_id" and (pa.types.is_floating(typ) or pa.types.is_integer(typ))
    ]
    values = np.empty((table.num_rows, len(numeric)), dtype=np.float32)
    for i, name in enumerate(numeric):
        col = table.column(name).cast(pa.float64()).to_numpy(zero_copy_only=False)
        values[:, i] = np.nan_to_num(col, nan=0.0, posinf=0.0, neginf=0.0)
    ids = table.column("customer_id").cast(pa.string()).to_pylist()
    return FeatureSnapshot(
        as_of=as_of,
        data_prefix=manifest.data_prefix,
        columns=tuple(numeric),
        values=values,
        row_of={cid: i for i, cid in enumerate(ids) if cid is not None},
        source=SourceEvents.of(manifest),
    )
