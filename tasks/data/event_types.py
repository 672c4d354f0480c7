"""The event types a run's validated events hold, counted: what an error about a log without
purchases names (its own word for them is what ``--purchase-event`` takes)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from infra.storage.datasets import DatasetManifest, local_dataset_dir, release_local_dir
from infra.storage.store import ObjectStore

SHOWN_EVENT_TYPES = 8
"""How many event types an error names, the most frequent first."""


def event_type_counts(store: ObjectStore, events: DatasetManifest) -> dict[str, int]:
    """Rows per ``event_type`` of the published good events, the most frequent first (only
    that column is read)."""
    folder = local_dataset_dir(store, events)
    try:  # file by file: pyarrow.dataset would import pandas into the deployed flows
        files = sorted(folder.rglob("*.parquet"))
        chunks = [pq.ParquetFile(f).read(columns=["event_type"]).column(0) for f in files]
    finally:
        release_local_dir(store, folder)
    if not chunks:
        return {}
    counted = pc.value_counts(pa.chunked_array(chunks).combine_chunks())
    pairs = [(v["values"].as_py(), v["counts"].as_py()) for v in counted]
    return dict(sorted(((str(v), n) for v, n in pairs), key=lambda p: (-p[1], p[0])))


def event_types_text(counts: dict[str, int], shown: int = SHOWN_EVENT_TYPES) -> str:
    """``'checkout' (1,234), 'view' (56)`` for the first ``shown`` event types."""
    listed = [f"{name!r} ({n:,})" for name, n in list(counts.items())[:shown]]
    more = f" and {len(counts) - shown} more" if len(counts) > shown else ""
    return ", ".join(listed) + more
