"""The backtest through the real stages (Spark features and preprocess, torch training): what
happens after T-H never reaches the backtest's snapshot or its model, and a history too short
for T-2H skips the backtest with the reason while the gate falls back to the test split."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from infra.compute.devices import Device
from infra.settings import HybridflowSettings
from infra.storage.datasets import local_dataset_dir, read_dataset_manifest
from infra.storage.store import LocalFolderStore
from tasks.data.demo_events import DemoDataParams, generate_demo_events
from tasks.ml.backtest import train_backtest_model
from tasks.ml.models.mlp import MLPSpec
from tasks.ml.normalizer import Normalizer
from tasks.ml.snapshot_reader import SnapshotStream
from tasks.reporting.records import write_stage_manifest
from tasks.stages.features import features_stage
from tasks.stages.preprocess import preprocess_stage
from tasks.stages.train import train_stage
from tasks.stages.validate import validate_stage

pytestmark = pytest.mark.integration

AS_OF = dt.date(2025, 12, 31)
H = 60
T_MINUS_H = pd.Timestamp(dt.datetime.combine(AS_OF, dt.time.max) - dt.timedelta(days=H), tz="UTC")


def _prepare(spark, store, events_dir, as_of=AS_OF, horizon=H):
    validated = validate_stage(spark, store, "r", str(events_dir), 0.05, use_cache=False)
    features = features_stage(spark, store, "r", validated, as_of, horizon, use_cache=False)
    prepared = preprocess_stage(spark, store, features, seed=7, use_cache=False, run_id="r")
    write_stage_manifest(store, "r", "features", features)
    write_stage_manifest(store, "r", "preprocess", prepared)
    return features, prepared


def _rewrite_after_t_minus_h(src, out, seed: int) -> None:
    """The same log up to T-H; after it, other events: amounts tripled, times redrawn, every
    second event dropped, and a customer seen only after T-H."""
    frame = pq.read_table(src).to_pandas()
    later = frame.event_time > T_MINUS_H
    after = frame[later].iloc[::2].copy()
    rng = np.random.default_rng(seed)
    offsets = rng.uniform(1.0, H * 86_400.0 - 1.0, len(after))
    after["event_time"] = T_MINUS_H + pd.to_timedelta(offsets, unit="s")
    after["amount"] = after["amount"] * 3
    new = after.iloc[:3].assign(customer_id="NEW-CUSTOMER")
    out.mkdir()
    table = pa.Table.from_pandas(pd.concat([frame[~later], after, new]), preserve_index=False)
    pq.write_table(table, out / "events.parquet")


def _snapshot(store, prefix, folder) -> tuple[pd.DataFrame, Normalizer, SnapshotStream]:
    """The snapshot's rows (sorted by customer) and normaliser, and a stream over a copy written
    in that order: Spark's row order within files follows its input files, and the order of
    mini-batches (not their content) would otherwise make two identical snapshots train apart."""
    manifest = read_dataset_manifest(store, prefix)
    normalizer = Normalizer.model_validate(manifest.metadata["normalizer"])
    frame = pd.read_parquet(local_dataset_dir(store, manifest))
    frame = frame.sort_values("customer_id").reset_index(drop=True)
    for split, rows in frame.groupby("split", observed=True):
        (folder / f"split={split}").mkdir(parents=True)
        rows.drop(columns="split").to_parquet(folder / f"split={split}" / "part.parquet")
    return frame, normalizer, SnapshotStream(folder, normalizer.features)


def test_events_after_t_minus_h_never_reach_the_backtest_snapshot_or_model(spark, tmp_path):
    original = tmp_path / "original"
    generate_demo_events(DemoDataParams(customers=500, days=400, seed=3, end_date=AS_OF), original)
    rewritten = tmp_path / "rewritten"
    _rewrite_after_t_minus_h(original, rewritten, seed=1)
    results = []
    for name, events in (("a", original), ("b", rewritten)):
        store = LocalFolderStore(tmp_path / f"store-{name}")
        features, prepared = _prepare(spark, store, events)
        assert features.backtest_skipped is None and prepared.backtest_snapshot_prefix
        results.append((store, features, prepared))
    (sa, fa, pa_), (sb, fb, pb) = results
    # the change after T-H is material: the run's own training labels differ
    assert fa.positive_rate != fb.positive_rate
    frame_a, norm_a, data_a = _snapshot(sa, pa_.backtest_snapshot_prefix, tmp_path / "copy-a")
    frame_b, norm_b, data_b = _snapshot(sb, pb.backtest_snapshot_prefix, tmp_path / "copy-b")
    pd.testing.assert_frame_equal(frame_a, frame_b)
    # Spark sums the normaliser statistics in file order: equal up to float rounding
    assert norm_a.features == norm_b.features
    np.testing.assert_allclose(norm_a.mean, norm_b.mean, rtol=1e-12)
    np.testing.assert_allclose(norm_a.std, norm_b.std, rtol=1e-12)
    assert fa.n_backtest == fb.n_backtest and "NEW-CUSTOMER" not in set(frame_b.customer_id)
    settings = HybridflowSettings().train.model_copy(update={"max_epochs": 3, "batch_size": 64})
    torch.set_num_threads(1)
    model_a = train_backtest_model(data_a, norm_a, MLPSpec(), settings, Device())
    model_b = train_backtest_model(data_b, norm_b, MLPSpec(), settings, Device())
    state_a, state_b = model_a.network.state_dict(), model_b.network.state_dict()
    for key in state_a:  # float32 normaliser buffers: the rounding above does not reach them
        assert torch.equal(state_a[key], state_b[key]), key


def test_short_history_skips_the_backtest_and_the_gate_uses_the_test_split(
    spark, tmp_path, monkeypatch
):
    events = tmp_path / "events"
    generate_demo_events(DemoDataParams(customers=1500, days=150, seed=4, end_date=AS_OF), events)
    store = LocalFolderStore(tmp_path / "store")
    features, prepared = _prepare(spark, store, events, horizon=90)
    assert "history too short for the backtest" in features.backtest_skipped
    assert prepared.backtest_snapshot_prefix is None
    assert prepared.backtest_skipped == features.backtest_skipped
    settings = HybridflowSettings()
    settings.train = settings.train.model_copy(
        update={"max_epochs": 4, "batch_size": 64, "threads": 1, "warm_start": False}
    )
    output = train_stage(
        store, prepared, settings, as_of=features.as_of, horizon_days=90, device_preference="cpu"
    )
    evaluation = output.result.evaluation
    assert evaluation is not None and evaluation.backtest.status == "skipped"
    assert evaluation.backtest.reason == features.backtest_skipped
    assert output.decision.baseline is not None
    assert output.decision.baseline.basis == "test split"
    assert "backtest skipped: history too short" in output.decision.reason
    assert output.result.metrics["logloss"] == evaluation.test.model.logloss
