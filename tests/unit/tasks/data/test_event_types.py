"""The event types a run's published events hold, counted for the error of a log without
purchases."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from infra.storage.datasets import publish_dataset
from infra.storage.store import LocalFolderStore
from tasks.data.event_types import event_type_counts, event_types_text


def test_event_types_of_published_events_are_counted_most_first(tmp_path):
    store = LocalFolderStore(tmp_path / "store")
    data = tmp_path / "data"
    data.mkdir()
    parts = (["view", "checkout", "view"], ["view", "add_to_cart", "checkout"])
    for i, types in enumerate(parts):
        table = pa.table({"customer_id": ["c"] * len(types), "event_type": types})
        pq.write_table(table, data / f"part-{i:05d}.snappy.parquet")
    manifest = publish_dataset(store, data, "runs/r1/events", rows=6)
    counts = event_type_counts(store, manifest)
    assert list(counts.items()) == [("view", 3), ("checkout", 2), ("add_to_cart", 1)]
    assert event_types_text(counts, shown=2) == "'view' (3), 'checkout' (2) and 1 more"
