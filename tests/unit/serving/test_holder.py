"""The model holder against a real folder store: swaps, refusals, snapshot handling."""

from __future__ import annotations

import datetime as dt
import logging

import pyarrow as pa
import pytest

from infra.layout import alias_key, version_file_key
from infra.storage.registry import ModelRegistry
from infra.storage.store import LocalFolderStore
from serving.holder import ModelHolder
from serving.metrics import ServingMetrics
from serving.snapshot import newest_snapshot_manifest
from tests.fixtures.serving_sample import (
    point_alias_unverified,
    publish_sample_snapshot,
    register_sample_model,
    sample_feature_table,
)


@pytest.fixture
def store(tmp_path):
    return LocalFolderStore(tmp_path / "store")


@pytest.fixture
def table():
    return sample_feature_table(300, seed=5)


def _failures(metrics: ServingMetrics, kind: str, reason: str) -> float:
    value = metrics.registry.get_sample_value(
        "hybridflow_serving_model_reload_failures_total", {"kind": kind, "reason": reason}
    )
    return value or 0.0


def test_empty_store_serves_nothing_until_a_model_is_promoted(store, table):
    holder = ModelHolder(store, ServingMetrics())
    report = holder.refresh()
    assert holder.state.model is None and report.model_version is None
    v1 = register_sample_model(store, table, seed=1)
    report = holder.refresh()
    assert holder.state.model.version == v1
    assert report.changed == [f"model nothing -> {v1}"]
    assert holder.state.snapshot is None  # raw features only


def test_newest_snapshot_wins_and_is_swapped_with_the_model(store, table):
    publish_sample_snapshot(store, table.slice(0, 100), dt.date(2025, 6, 30))
    publish_sample_snapshot(store, table, dt.date(2025, 12, 31))
    publish_sample_snapshot(store, table.slice(0, 50), dt.date(2025, 9, 30))
    assert newest_snapshot_manifest(store).prefix == "features/as_of=2025-12-31"
    register_sample_model(store, table, seed=1)
    holder = ModelHolder(store, ServingMetrics())
    holder.refresh()
    state = holder.state
    assert state.snapshot.as_of == dt.date(2025, 12, 31) and state.snapshot.rows == 300
    row = state.snapshot.row_of["c000010"]
    values = state.snapshot.values[row, state.snapshot_columns]
    assert values[0] == pytest.approx(table.column(state.model.features[0])[10].as_py(), rel=1e-6)
    before = holder.state
    holder.refresh()
    assert holder.state is before  # nothing changed: the very same state object


def test_corrupt_and_nan_versions_are_refused_once_and_the_old_model_stays(store, table):
    publish_sample_snapshot(store, table, dt.date(2025, 12, 31))
    v1 = register_sample_model(store, table, seed=1)
    metrics = ServingMetrics()
    holder = ModelHolder(store, metrics)
    holder.refresh()
    served = holder.state

    v2 = register_sample_model(store, table, seed=2, promote=False)
    path = store.local_path(version_file_key(v2, "model.pt"))
    path.write_bytes(b"not a torch file")
    point_alias_unverified(store, v2, "damaged after its promotion")
    report = holder.refresh()
    assert holder.state is served and holder.state.model.version == v1
    assert "checksum" in report.refused[0] and v2 in report.refused[0]
    holder.refresh()  # same alias token: not retried
    assert _failures(metrics, "model", "checksum") == 1
    holder.refresh(force=True)
    assert _failures(metrics, "model", "checksum") == 2

    register_sample_model(store, table, seed=3, nan_weights=True)
    report = holder.refresh()
    assert "non-finite" in report.refused[0]
    assert _failures(metrics, "model", "warmup_nan") == 1
    assert holder.state.model.version == v1
    assert holder.last_error and "warmup_nan" in holder.last_error


def test_snapshot_without_the_models_features_is_refused(store, table):
    publish_sample_snapshot(store, table, dt.date(2025, 12, 31))
    register_sample_model(store, table, seed=1)
    metrics = ServingMetrics()
    holder = ModelHolder(store, metrics)
    holder.refresh()
    publish_sample_snapshot(store, table.drop_columns(["tenure_days"]), dt.date(2026, 1, 31))
    report = holder.refresh()
    assert holder.state.snapshot.as_of == dt.date(2025, 12, 31)
    assert "tenure_days" in report.refused[0]
    assert _failures(metrics, "snapshot", "features_missing") == 1


def test_model_needing_features_the_snapshot_lacks_is_refused(store, table):
    narrow = table.drop_columns(["n_channels"])
    publish_sample_snapshot(store, narrow, dt.date(2025, 12, 31))
    register_sample_model(store, table, seed=1)
    holder = ModelHolder(store, ServingMetrics())
    report = holder.refresh()
    assert holder.state.model is None
    assert "n_channels" in report.refused[0]


def test_snapshot_nulls_become_zero_like_batch_scoring(store, table):
    col = table.column("recency_days").to_pylist()
    col[0] = None
    patched = table.set_column(
        table.column_names.index("recency_days"), "recency_days", pa.array(col, pa.float64())
    )
    publish_sample_snapshot(store, patched, dt.date(2025, 12, 31))
    register_sample_model(store, table, seed=1)
    holder = ModelHolder(store, ServingMetrics())
    holder.refresh()
    snap = holder.state.snapshot
    assert snap.values[snap.row_of["c000000"], snap.columns.index("recency_days")] == 0.0


def test_a_damaged_alias_is_refused_once_and_a_promotion_repairs_it(store, table, caplog):
    v1 = register_sample_model(store, table, seed=1)
    v2 = register_sample_model(store, table, seed=2, promote=False)
    metrics = ServingMetrics()
    holder = ModelHolder(store, metrics)
    holder.refresh()
    path = store.local_path(alias_key("production"))
    path.write_bytes(path.read_bytes()[:40])  # truncated
    with caplog.at_level(logging.ERROR, logger="serving.holder"):
        for _ in range(5):
            holder.refresh()
    assert _failures(metrics, "model", "alias_damaged") == 1, "refused on every poll"
    assert len([r for r in caplog.records if "alias_damaged" in r.getMessage()]) == 1
    assert holder.state.model.version == v1
    assert "models/aliases/production.json is damaged" in holder.last_error

    ModelRegistry(store).set_alias(v2, "repair")
    report = holder.refresh()
    assert holder.state.model.version == v2 and report.changed == [f"model {v1} -> {v2}"]
    assert holder.last_error is None


def test_ready_forgets_a_refusal_once_the_alias_is_back_on_the_served_version(store, table):
    v1 = register_sample_model(store, table, seed=1)
    v2 = register_sample_model(store, table, seed=2, promote=False)
    holder = ModelHolder(store, ServingMetrics())
    holder.refresh()
    ModelRegistry(store).set_alias(v2, "promoted while it verified")
    _damage(store, v2)  # ... and damaged before this endpoint loaded it
    holder.refresh()
    assert v2 in holder.last_error and holder.state.model.version == v1
    holder.refresh()  # not retried, still reported
    assert v2 in holder.last_error

    ModelRegistry(store).set_alias(v1, "back to the served version")
    holder.refresh()
    assert holder.state.model.version == v1 and holder.last_error is None


def test_a_refused_snapshot_is_forgotten_when_a_good_one_replaces_it(store, table):
    publish_sample_snapshot(store, table, dt.date(2025, 12, 31))
    register_sample_model(store, table, seed=1)
    holder = ModelHolder(store, ServingMetrics())
    holder.refresh()
    publish_sample_snapshot(store, table.drop_columns(["tenure_days"]), dt.date(2026, 1, 31))
    holder.refresh()
    assert "tenure_days" in holder.last_error
    publish_sample_snapshot(store, table, dt.date(2026, 2, 28))
    holder.refresh()
    assert holder.state.snapshot.as_of == dt.date(2026, 2, 28) and holder.last_error is None


def _damage(store, version: str) -> None:
    path = store.local_path(version_file_key(version, "model.pt"))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
