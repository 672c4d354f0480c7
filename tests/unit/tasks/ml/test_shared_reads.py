"""What the contenders of one process share of a snapshot (tasks.ml.snapshot_reader): inside
``shared_reads`` each file is decoded once for every view of the same rows, and nothing outside
it; a view's rows, labels and counts are the same whichever way they are read (its origin, its
label-free train sample); the fingerprint is the value it always was."""

from __future__ import annotations

import contextlib
import datetime as dt

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.ml import snapshot_reader
from tasks.ml.snapshot_reader import SAMPLE_BUCKETS, SnapshotStream, shared_reads

FEATURES = ["recency_days", "n_purchases"]
ORIGINS = [dt.date(2025, 4, 1), dt.date(2025, 1, 1)]


@pytest.fixture
def root(tmp_path):
    """Two origins, three splits of two files each; every customer at both origins."""
    rng = np.random.default_rng(3)
    for split, n in (("train", 900), ("val", 300), ("test", 300)):
        (tmp_path / f"split={split}").mkdir()
        for part in range(2):
            ids = [f"{split}{part}-{i}" for i in range(n)] * 2
            table = pa.table(
                {
                    "customer_id": ids,
                    "label": (rng.random(2 * n) < 0.3).astype(np.float64),
                    "recency_days": rng.exponential(30, 2 * n),
                    "n_purchases": np.where(rng.random(2 * n) < 0.1, np.nan, 3.0),
                    "origin": pa.array([ORIGINS[0]] * n + [ORIGINS[1]] * n, pa.date32()),
                }
            )
            pq.write_table(table, tmp_path / f"split={split}" / f"part-{part}.parquet")
    return tmp_path


def _decodes(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = snapshot_reader.input_matrix

    def counted(data, inputs):
        calls.append(data.num_rows)
        return real(data, inputs)

    monkeypatch.setattr(snapshot_reader, "input_matrix", counted)
    return calls


def _rows(stream: SnapshotStream, split: str) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = zip(*stream.chunks(split), strict=True)
    return np.concatenate(xs), np.concatenate(ys)


def test_views_of_the_same_rows_decode_each_file_once_inside_the_scope(root, monkeypatch):
    calls = _decodes(monkeypatch)
    alone = [_rows(SnapshotStream(root, FEATURES, chunk_rows=256), "train") for _ in range(2)]
    assert len(calls) == 2 * 2 * 8  # two views, two files of 1,800 rows in 256-row batches
    calls.clear()
    with shared_reads():
        views = [SnapshotStream(root, FEATURES, chunk_rows=256) for _ in range(3)]
        shared = [_rows(v, "train") for v in views]
        assert len(calls) == 2 * 8  # the first view decoded, the others found its arrays
        newest = SnapshotStream(root, FEATURES, chunk_rows=256).newest_origin()
        _rows(newest, "train")
        assert len(calls) == 2 * 8 + 2 * 8  # another view of the files: its own rows
        first, _ = shared[0]
        first[:] = -1.0  # a caller writing to what it got changes nobody else's rows
        assert np.array_equal(_rows(views[1], "train")[0], alone[0][0])
    for x, y in shared[1:]:
        assert np.array_equal(x, alone[0][0]) and np.array_equal(y, alone[0][1])
    assert snapshot_reader._shared == {} and snapshot_reader._shared_bytes == 0  # dropped
    calls.clear()
    _rows(SnapshotStream(root, FEATURES, chunk_rows=256), "train")
    assert len(calls) == 2 * 8
    calls.clear()
    with shared_reads():  # a budget of nothing shares nothing
        for _ in range(2):
            _rows(SnapshotStream(root, FEATURES, chunk_rows=256, cache_bytes=0), "train")
    assert len(calls) == 2 * 2 * 8


def test_a_views_rows_and_labels_are_the_same_read_any_way(root):
    stream = SnapshotStream(root, FEATURES, chunk_rows=256)
    table = pa.concat_tables(pq.read_table(f) for f in stream.splits["train"].files)
    newest = table.filter(pa.compute.equal(table["origin"], pa.scalar(ORIGINS[0], pa.date32())))
    ids = newest["customer_id"].to_numpy(zero_copy_only=False).astype(object)
    kept = pd.util.hash_array(ids) % SAMPLE_BUCKETS < 0.5 * SAMPLE_BUCKETS
    expected_y = newest["label"].to_numpy()[kept].astype(np.float32)
    for scope in (shared_reads, contextlib.nullcontext):
        with scope():
            sample = stream.newest_origin().train_sample(0.5)
            assert sample.rows("train") == int(kept.sum())
            x, y = sample.arrays("train")
            assert np.array_equal(y, expected_y)
            assert np.array_equal(x[:, 0], newest["recency_days"].to_numpy()[kept].astype("f4"))
            for split in ("train", "val"):
                cx, cy = _rows(sample, split)
                ax, ay = sample.arrays(split)
                assert np.array_equal(cx, ax) and np.array_equal(cy, ay)
            counts = sample.label_counts()
            for split in ("train", "val", "test"):
                assert counts[split] == (sample.rows(split), int(_rows(sample, split)[1].sum()))
    assert counts["train"][1] == int(expected_y.sum())


def test_the_fingerprint_is_the_value_it_always_was(root):
    stream = SnapshotStream(root, FEATURES)
    digest: dict[str, object] = {"features": FEATURES}
    for split, info in stream.splits.items():
        total = 0
        for path in info.files:
            table = pq.read_table(path)
            frame = pd.DataFrame(
                {n: table[n].to_numpy().astype(np.float32) for n in ["label", *FEATURES]}
            )
            frame["customer_id"] = table["customer_id"].to_numpy(zero_copy_only=False)
            frame["origin"] = table["origin"].cast(pa.int32()).to_numpy(False)
            hashes = pd.util.hash_pandas_object(frame, index=False).to_numpy(np.uint64)
            total = (total + int(hashes.sum(dtype=np.uint64))) % (1 << 64)
        digest[split] = f"{info.rows}:{total:016x}"
    expected = snapshot_reader.sha256_bytes(repr(sorted(digest.items())).encode())
    assert stream._fingerprint() == expected
