"""The snapshot stream's chunks read without a copy (``copy=False``) for callers that only read
them: the same rows as the copies, and the cache's own memory where a chunk lies in one batch."""

from __future__ import annotations

import numpy as np

from infra.storage.store import LocalFolderStore
from tests.fixtures.synthetic_snapshot import publish_synthetic_snapshot, synthetic_stream


def test_chunks_without_a_copy_hold_the_same_rows_and_share_the_cache(tmp_path):
    store = LocalFolderStore(tmp_path / "store")
    _, prepared = publish_synthetic_snapshot(store, "chunks", rows=3000, seed=4)
    data = synthetic_stream(store, prepared, chunk_rows=50)[0]
    copies = list(data.chunks("val"))
    views = list(data.chunks("val", copy=False))
    assert len(copies) == len(views) > 1
    for (cx, cy), (vx, vy) in zip(copies, views, strict=True):
        np.testing.assert_array_equal(cx, vx)
        np.testing.assert_array_equal(cy, vy)
    again = list(data.chunks("val", copy=False))
    shared = [np.shares_memory(a, b) for (a, _), (b, _) in zip(views, again, strict=True)]
    assert any(shared)  # read twice without a copy: the same cached arrays
    assert not any(np.shares_memory(c, v) for (c, _), (v, _) in zip(copies, views, strict=True))
    copies[0][0][:] = -1.0  # a copy is the caller's to write
    np.testing.assert_array_equal(next(iter(data.chunks("val", copy=False)))[0], views[0][0])
    assert not (views[0][0] == -1.0).all()
