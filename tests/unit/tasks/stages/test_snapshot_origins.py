"""A snapshot of examples from several origins: preprocess puts a customer in the same split at
every origin (no customer on both sides of a split), records the origins, carries the sequence
columns, and the reader's view of the newest origin holds exactly its rows (the features only);
a snapshot without origins is one origin."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from infra.compute.spark_io import spark_schema_metadata
from infra.storage.arrow_datasets import read_table, write_table
from infra.storage.datasets import local_dataset_dir, read_dataset_manifest
from tasks.engines.in_process.snapshot import InProcessSnapshotBuilder
from tasks.ml.snapshot_reader import SnapshotStream
from tasks.stages.preprocess import publish_snapshot

FEATURES = ["recency_days", "n_purchases"]
ORIGINS = [dt.date(2025, 4, 1), dt.date(2025, 1, 1), dt.date(2024, 10, 3)]


def _examples(customers: int) -> pa.Table:
    """Customer ``c<i>`` is seen at the newest ``1 + i % 3`` origins (newer customers at fewer)."""
    rng = np.random.default_rng(5)
    rows = [
        {
            "customer_id": f"c{i}",
            "recency_days": float(rng.exponential(30)),
            "n_purchases": float(rng.integers(0, 9)),
            "label": float(rng.random() < 0.3),
            "origin": origin,
            "seq_length": 2,
            "seq_gap_days": [float(i % 7), 9.5, 0.0],
        }
        for i in range(customers)
        for origin in ORIGINS[: 1 + i % 3]
    ]
    return pa.Table.from_pylist(rows)


def test_a_customer_has_one_split_at_every_origin_and_the_newest_view_is_its_rows(local_store):
    examples = _examples(600)
    write_table(examples, local_store, "ex", metadata=spark_schema_metadata(examples.schema))
    snapshot, counts = publish_snapshot(
        InProcessSnapshotBuilder(), local_store, "ex", "snap", FEATURES, 7, ORIGINS
    )
    assert sum(counts.values()) == examples.num_rows == snapshot.rows
    manifest = read_dataset_manifest(local_store, "snap")
    assert manifest.metadata["origins"] == [o.isoformat() for o in ORIGINS]
    table = read_table(local_store, manifest, ["customer_id", "split", "origin", "seq_gap_days"])
    assert {tuple(v[1:]) for v in table["seq_gap_days"].to_pylist()} == {(9.5, 0.0)}  # carried
    splits: dict[str, set[str]] = {}
    for row in table.to_pylist():
        splits.setdefault(row["customer_id"], set()).add(row["split"])
    assert all(len(s) == 1 for s in splits.values()) and len(splits) == 600
    assert {next(iter(s)) for s in splits.values()} == {"train", "val", "test"}

    stream = SnapshotStream(local_dataset_dir(local_store, manifest), FEATURES, chunk_rows=128)
    assert stream.origins() == ORIGINS
    newest = stream.newest_origin()
    assert newest.origin == ORIGINS[0]
    for split in ("train", "val", "test"):
        in_split = {c for c, s in splits.items() if split in s}
        assert newest.rows(split) == len(in_split)  # every customer is seen at the newest
        ys = np.concatenate([y for _, y in newest.chunks(split)])
        assert len(ys) == newest.rows(split) < stream.rows(split)
    older = stream.at_origin(ORIGINS[2])
    assert sum(older.rows(s) for s in ("train", "val", "test")) == 200  # c2, c5, ...


def test_a_snapshot_without_origins_is_one_origin(tmp_path):
    for split in ("train", "val", "test"):
        (tmp_path / f"split={split}").mkdir()
        table = pa.table({"customer_id": ["a", "b"], "label": [0.0, 1.0], "x": [1.0, 2.0]})
        pq.write_table(table, tmp_path / f"split={split}" / "part-0.parquet")
    stream = SnapshotStream(tmp_path, ["x"])
    assert stream.origins() == [] and stream.newest_origin() is stream
    assert stream.rows("test") == 2
