"""The endpoint serves the feature snapshot of the production model's run (issue 32, items 1
and 11), never "the largest date": a features-only run (or one killed before training) at
9999-12-31 changes nothing served; promotion and rollback move model and snapshot together;
`hybridflow snapshots` lists and retires them, never production's; a damaged dataset manifest
is refused once, logged once naming its key, and repaired by `snapshots repair`."""

from __future__ import annotations

import datetime as dt
import logging

import pytest

from infra.errors import HybridflowInputError
from infra.layout import dataset_manifest_key
from infra.storage.datasets import DatasetManifestDamaged, find_dataset
from infra.storage.registry import ModelRegistry
from infra.storage.snapshots import list_datasets, repair, retire
from infra.storage.store import LocalFolderStore
from serving.holder import ModelHolder
from serving.metrics import ServingMetrics
from tests.fixtures.serving_sample import (
    publish_sample_snapshot,
    register_sample_model,
    sample_feature_table,
)

GOOD = dt.date(2025, 12, 31)
FUTURE = dt.date(9999, 12, 31)


@pytest.fixture
def store(tmp_path):
    return LocalFolderStore(tmp_path / "store")


def _failures(metrics: ServingMetrics, reason: str) -> float:
    value = (
        metrics.registry.get_sample_value(
            "hybridflow_serving_model_reload_failures_total", {"kind": "model", "reason": reason}
        )
        or 0.0
    )
    return value + (
        metrics.registry.get_sample_value(
            "hybridflow_serving_model_reload_failures_total",
            {"kind": "snapshot", "reason": reason},
        )
        or 0.0
    )


def test_the_production_models_run_snapshot_is_served_never_the_largest_date(store):
    table = sample_feature_table(300, seed=5)
    good = publish_sample_snapshot(store, table, GOOD, run_id="run-a")
    v1 = register_sample_model(store, table, seed=1, scoring_features=good)
    holder = ModelHolder(store, ServingMetrics())
    holder.refresh()
    assert holder.state.model.version == v1 and holder.state.snapshot.as_of == GOOD
    # a features-only run (or one killed during preprocess) publishes 9999-12-31: nothing moves
    future = publish_sample_snapshot(store, table.slice(0, 40), FUTURE, run_id="run-b")
    publish_sample_snapshot(store, table.slice(0, 30), FUTURE)  # even a run-less one
    report = holder.refresh()
    assert report.changed == [] and holder.state.snapshot.as_of == GOOD
    assert holder.state.snapshot.rows == 300
    # promoting the version trained with it moves both; a rollback moves both back
    v2 = register_sample_model(store, table, seed=2, scoring_features=future)
    holder.refresh()
    assert holder.state.model.version == v2 and holder.state.snapshot.as_of == FUTURE
    ModelRegistry(store).rollback()
    holder.refresh()
    assert holder.state.model.version == v1 and holder.state.snapshot.as_of == GOOD
    assert holder.state.snapshot.rows == 300


def test_snapshots_are_listed_and_retired_but_never_production_s(store):
    table = sample_feature_table(100, seed=5)
    good = publish_sample_snapshot(store, table, GOOD, run_id="run-a")
    other = publish_sample_snapshot(store, table, FUTURE, run_id="run-b")
    v1 = register_sample_model(store, table, seed=1, scoring_features=good)
    listed = {d.prefix: d for d in list_datasets(store)}
    assert listed[good].used_by == (v1,) and listed[good].run_id == "run-a"
    assert listed[other].used_by == () and listed[other].as_of == FUTURE
    with pytest.raises(HybridflowInputError, match=f"recorded by model version.*{v1}"):
        retire(store, good)
    retire(store, other)
    assert find_dataset(store, other) is None and store.list(other) == []
    assert find_dataset(store, good) is not None
    with pytest.raises(HybridflowInputError, match="no feature dataset"):
        retire(store, other)


def test_a_damaged_manifest_is_refused_once_naming_its_key_and_repaired(store, caplog):
    table = sample_feature_table(200, seed=5)
    good = publish_sample_snapshot(store, table, GOOD, run_id="run-a")
    v1 = register_sample_model(store, table, seed=1, scoring_features=good)
    metrics = ServingMetrics()
    holder = ModelHolder(store, metrics)
    holder.refresh()
    damaged = publish_sample_snapshot(store, table.slice(0, 150), GOOD, run_id="run-c")
    key = dataset_manifest_key(damaged)
    store.put_bytes(key, store.get_bytes(key)[:40])  # truncated
    with pytest.raises(DatasetManifestDamaged, match=f"{key}.*hybridflow snapshots repair"):
        find_dataset(store, damaged)
    v2 = register_sample_model(store, table, seed=2, scoring_features=damaged)
    caplog.set_level(logging.ERROR, logger="serving.holder")
    for _ in range(4):
        holder.refresh()
    assert holder.state.model.version == v1 and holder.state.snapshot.rows == 200
    logged = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(logged) == 1 and key in logged[0]
    assert _failures(metrics, "manifest_damaged") == 1
    assert key in (holder.last_error or "")
    repaired = repair(store, damaged)
    assert repaired.rows == 150
    holder.refresh(force=True)
    assert holder.state.model.version == v2 and holder.state.snapshot.rows == 150
    assert holder.last_error is None
    # publishing over a damaged manifest names it too (no pydantic dump)
    store.put_bytes(key, b"{}")
    with pytest.raises(DatasetManifestDamaged, match="repair it with"):
        publish_sample_snapshot(store, table, GOOD, run_id="run-c")


def test_repair_names_the_newest_whole_generation(store, tmp_path):
    import pyarrow.parquet as pq

    from infra.layout import scoring_features_prefix
    from infra.storage.datasets import publish_dataset

    table = sample_feature_table(50, seed=5)
    prefix = scoring_features_prefix(GOOD, "run-a")
    for i, rows in enumerate((50, 20)):  # two generations, a minute apart
        folder = tmp_path / f"g{i}"
        folder.mkdir()
        pq.write_table(table.slice(0, rows), folder / "part-0.parquet")
        now = dt.datetime(2026, 1, 1, 12, i, tzinfo=dt.UTC)
        publish_dataset(store, folder, prefix, rows=rows, now=now)
    current = find_dataset(store, prefix)
    store.put_bytes(dataset_manifest_key(prefix), b"not json")
    assert repair(store, prefix).data_prefix == current.data_prefix
    assert find_dataset(store, prefix).rows == 20
    assert repair(store, prefix).data_prefix == current.data_prefix  # intact: left as it is


def test_the_snapshots_command(store, tmp_path, monkeypatch, capsys):
    from cli.main import main
    from infra.settings import get_settings

    table = sample_feature_table(60, seed=5)
    good = publish_sample_snapshot(store, table, GOOD, run_id="run-a")
    other = publish_sample_snapshot(store, table, FUTURE, run_id="run-b")
    v1 = register_sample_model(store, table, seed=1, scoring_features=good)
    monkeypatch.setenv("HYBRIDFLOW_STORE", str(tmp_path / "store"))
    get_settings.cache_clear()
    try:
        assert main(["snapshots", "list"]) == 0
        out = capsys.readouterr().out
        assert f"features  {good}  60 rows" in out and f"served/needed by {v1}" in out
        assert main(["snapshots", "retire", good]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and v1 in err and "Traceback" not in err
        assert main(["snapshots", "retire", other]) == 0
        store.put_bytes(dataset_manifest_key(good), b"{")
        assert main(["snapshots", "list"]) == 0
        assert "DAMAGED" in capsys.readouterr().out
        assert main(["snapshots", "repair", good]) == 0
        assert f"{good} -> {good}/data-" in capsys.readouterr().out
    finally:
        get_settings.cache_clear()
