"""A snapshot's facts (fingerprint, label counts, the baseline) computed once per process for
the same files, and again when a file changes: what lets a run's contenders, fitted one after
another in one process, share them."""

from __future__ import annotations

import os

import pyarrow.compute as pc
import pyarrow.parquet as pq

from infra.storage.store import LocalFolderStore
from tasks.ml import snapshot_reader
from tasks.ml.backtest import baseline_of
from tasks.ml.snapshot_reader import SnapshotStream
from tests.fixtures.synthetic_snapshot import publish_synthetic_snapshot, synthetic_stream


def _stream(tmp_path) -> SnapshotStream:
    store = LocalFolderStore(tmp_path / "store")
    _, prepared = publish_synthetic_snapshot(store, "memo", rows=3000, seed=2)
    return synthetic_stream(store, prepared, chunk_rows=500)[0]


def test_a_snapshots_facts_are_computed_once_per_process_and_again_when_a_file_changes(
    tmp_path, monkeypatch
):
    data = _stream(tmp_path)
    calls: list[str] = []
    real = SnapshotStream._fingerprint

    def counted(self):
        calls.append("fingerprint")
        return real(self)

    monkeypatch.setattr(SnapshotStream, "_fingerprint", counted)
    first = data.fingerprint()
    again = SnapshotStream(data.root, data.features, chunk_rows=500)  # a fresh view
    assert again.fingerprint() == first and len(calls) == 1
    counts = again.label_counts()
    assert counts == data.label_counts()
    assert {split: n for split, (n, _) in counts.items()} == {s: data.rows(s) for s in data.splits}
    baseline = baseline_of(data)
    assert baseline_of(again) is baseline
    # the same files rewritten with other labels: new facts, not the memo's
    path = data.splits["train"].files[0]
    table = pq.read_table(path)
    flipped = table.set_column(
        table.schema.get_field_index("label"),
        "label",
        pc.subtract(1, table["label"]),
    )
    pq.write_table(flipped, path)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    changed = SnapshotStream(data.root, data.features, chunk_rows=500)
    assert changed.fingerprint() != first and len(calls) == 2
    assert changed.label_counts()["train"] != counts["train"]
    assert baseline_of(changed).coefficients != baseline.coefficients


def test_the_memo_keeps_at_most_its_entries(monkeypatch):
    monkeypatch.setattr(snapshot_reader, "_memo", {})
    monkeypatch.setattr(snapshot_reader, "MEMO_ENTRIES", 2)
    computed: list[int] = []

    def value(i: int) -> int:
        computed.append(i)
        return i

    for i in (1, 2, 3, 1):
        assert snapshot_reader.memoised("fact", (i,), lambda i=i: value(i)) == i
    assert computed == [1, 2, 3, 1]  # 1 was dropped when 3 came
    assert snapshot_reader.memoised("fact", (3,), lambda: value(99)) == 3
