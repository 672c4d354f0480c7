"""A features task whose DuckDB runs out of its memory fails with the limit it had and the
setting that raises it, and puts no part into the store."""

from __future__ import annotations

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from infra.errors import HybridflowInputError
from infra.storage.store import LocalFolderStore
from tasks.data.cutoffs import pipeline_cutoffs
from tasks.data.demo_events import DemoDataParams, generate_demo_events
from tasks.engines.spark.features_per_bucket import bucket_features

AVAILABLE = {"event_type", "quantity", "category", "channel"}


def test_a_task_out_of_memory_names_its_limit_and_writes_nothing(tmp_path):
    generate_demo_events(DemoDataParams(customers=2000, days=400, seed=1), tmp_path / "events")
    store = LocalFolderStore(tmp_path)
    files = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "events").glob("*.parquet"))
    last = pc.max(pq.read_table(tmp_path / "events", columns=["event_time"])[0]).as_py()
    targets = [((c,), f"out/{c.name}.parquet") for c in pipeline_cutoffs(last.date(), 90)]

    parts, _ = bucket_features(store, files, AVAILABLE, targets, memory="256MB")
    assert [p.rows for p in parts] and all(store.exists(key) for _, key in targets)
    store.delete_prefix("out")

    with pytest.raises(HybridflowInputError) as caught:
        bucket_features(store, files, AVAILABLE, targets, memory="4MB")
    message = str(caught.value)
    assert message.startswith("a features task needs more memory") and "(4MB)" in message
    assert "HYBRIDFLOW_IN_PROCESS_MEMORY" in message
    assert "HYBRIDFLOW_IN_PROCESS_ROWS" not in message  # the task is Spark's already
    assert store.list("out") == []
