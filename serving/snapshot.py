"""A scoring-feature snapshot, held in memory for lookups by ``customer_id``.

The features stage of each run publishes its own dataset at
``features/as_of=YYYY-MM-DD/run=<run_id>/`` and every model version records the one of the run
that trained it: that is the snapshot served with it (:mod:`serving.holder`). Versions from
before that record none; they are served with the newest run-less ``features/as_of=YYYY-MM-DD/``. The whole snapshot is loaded into one float32 matrix plus a dict from
customer id to row: about ``rows * (4 * columns + 100)`` bytes, fine for up to a few million
customers.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads

from infra.errors import StoreError
from infra.layout import (
    FEATURES,
    dataset_manifest_key,
    run_dataset_of,
    scoring_features_date,
    scoring_features_prefix,
)
from infra.storage.datasets import (
    DatasetManifest,
    SourceEvents,
    find_dataset,
    local_dataset_dir,
    release_local_dir,
)
from infra.storage.store import ObjectStore
from tasks.definitions.examples import sequence_element
from tasks.ml.model_inputs import list_matrix


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
    """The manifest of the newest published run-less scoring-feature dataset, or None (a run's
    own datasets are served only with the model that run trained)."""
    dates = sorted(d for key in store.list(FEATURES) if (d := scoring_features_date(key)))
    for as_of in reversed(dates):
        manifest = find_dataset(store, scoring_features_prefix(as_of))
        if manifest is not None:
            return manifest
    return None


def load_snapshot(store: ObjectStore, manifest: DatasetManifest) -> FeatureSnapshot:
    """Read a published scoring-feature dataset into memory."""
    key = dataset_manifest_key(manifest.prefix)
    run_dataset = run_dataset_of(key)
    as_of = run_dataset[1] if run_dataset else scoring_features_date(key)
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
    # a sequence model's inputs: every position of the lists of numbers (``seq_amount[3]``)
    lists = {
        name: list_matrix(table.column(name))
        for name, typ in zip(table.column_names, table.schema.types, strict=True)
        if pa.types.is_list(typ)
        and (pa.types.is_floating(typ.value_type) or pa.types.is_integer(typ.value_type))
    }
    elements = [(name, i) for name, m in lists.items() for i in range(m.shape[1])]
    values = np.empty((table.num_rows, len(numeric) + len(elements)), dtype=np.float32)
    for i, name in enumerate(numeric):
        col = table.column(name).cast(pa.float64()).to_numpy(zero_copy_only=False)
        values[:, i] = np.nan_to_num(col, nan=0.0, posinf=0.0, neginf=0.0)
    for i, (name, position) in enumerate(elements, start=len(numeric)):
        col = lists[name][:, position].astype(np.float64)
        values[:, i] = np.nan_to_num(col, nan=0.0, posinf=0.0, neginf=0.0)
    numeric += [sequence_element(name, position) for name, position in elements]
    ids = table.column("customer_id").cast(pa.string()).to_pylist()
    return FeatureSnapshot(
        as_of=as_of,
        data_prefix=manifest.data_prefix,
        columns=tuple(numeric),
        values=values,
        row_of={cid: i for i, cid in enumerate(ids) if cid is not None},
        source=SourceEvents.of(manifest),
    )
