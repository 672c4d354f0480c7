"""The validate, features and preprocess stages give the same outputs in this process (DuckDB,
pyarrow) as with Spark, without starting it: the same good events and quarantine; the same
customers, features, labels and figures; the same split of every customer and the same
normaliser; and Spark reads what the in-process stages publish."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from infra.compute.spark_io import read_dataset
from infra.errors import HybridflowInputError
from infra.layout import run_dataset_prefix
from infra.settings import get_settings
from infra.storage.arrow_datasets import read_table
from infra.storage.datasets import read_dataset_manifest
from tasks.data.cutoffs import Origins
from tasks.data.demo_events import DemoDataParams, generate_demo_events
from tasks.data.input_formats import InputOptions
from tasks.stages.features import features_stage
from tasks.stages.preprocess import preprocess_stage
from tasks.stages.validate import validate_stage

pytestmark = pytest.mark.integration

SPARK = 0  # in_process_rows that makes both stages use Spark
IN_PROCESS = 10**9


def no_spark():
    raise AssertionError("an in-process stage started Spark")


def _rows(store, prefix: str) -> dict[tuple, dict]:
    """A dataset's rows by customer and origin (None: features without one)."""
    table = read_table(store, read_dataset_manifest(store, prefix))
    return {(r.pop("customer_id"), r.pop("origin", None)): r for r in table.to_pylist()}


def _same_rows(expected: dict[tuple, dict], got: dict[tuple, dict]) -> None:
    assert list(got) == sorted(got) and set(got) == set(expected) and got
    for cid, values in got.items():
        assert values == pytest.approx(expected[cid], rel=1e-9, abs=1e-9), cid


def _all_rows(store, prefix: str) -> list[tuple]:
    """The rows, sorted; times as naive UTC micros (Spark writes INT96, pyarrow zoned micros)."""
    table = read_table(store, read_dataset_manifest(store, prefix))
    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            table = table.set_column(i, field.name, table[i].cast(pa.timestamp("us")))
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=repr)


def test_validate_in_process_equals_spark(spark, local_store, tmp_path):
    """Two files, a mapped column, an extra column, planted bad rows and duplicates."""
    demo = tmp_path / "demo"
    generate_demo_events(DemoDataParams(customers=400, days=300, seed=4), demo)
    table = pq.read_table(next(demo.glob("*.parquet")))
    table = table.rename_columns(["Revenue" if c == "amount" else c for c in table.column_names])
    table = table.append_column("note", pa.array(["x"] * table.num_rows))
    events = tmp_path / "events"
    events.mkdir()
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half), events / "part-0.parquet")
    pq.write_table(table.slice(half - 50), events / "part-1.parquet")  # 50 rows twice
    options = InputOptions(column_map={"amount": "revenue"})

    def validate(run_id: str, spark_or_none, limit: int):
        return validate_stage(
            spark_or_none,
            local_store,
            run_id,
            str(events),
            0.5,
            options,
            False,
            in_process_rows=limit,
        )

    on_spark = validate("s", spark, SPARK)
    here = validate("l", no_spark, IN_PROCESS)
    assert on_spark.report.spark_jobs and here.report.spark_jobs == 0
    figures = (
        "rows_read",
        "rows_valid",
        "rows_quarantined",
        "quarantine_reasons",
        "available_columns",
        "first_event",
        "last_event",
    )
    assert [getattr(here, f) for f in figures] == [getattr(on_spark, f) for f in figures]
    assert here.rows_read == table.num_rows + 50
    assert here.quarantine_reasons["duplicate_event"] >= 50
    for prefix in ("events_prefix", "quarantine_prefix"):
        assert _all_rows(local_store, getattr(here, prefix)) == _all_rows(
            local_store, getattr(on_spark, prefix)
        )
    events_read = read_dataset(spark, local_store, here.events_prefix)
    assert events_read.count() == here.rows_valid
    kept = read_table(local_store, read_dataset_manifest(local_store, here.events_prefix))
    assert pc.min(kept["event_time"]).as_py() == here.first_event


def test_features_and_snapshot_in_process_equal_spark(spark, local_store, tmp_path):
    events = tmp_path / "events"
    generate_demo_events(DemoDataParams(customers=600, days=500, seed=9), events)
    validated = validate_stage(spark, local_store, "v", str(events), 0.05, use_cache=False)

    origins = Origins(count=3, stride_days=45)

    def features(run_id: str, engine, limit: int):
        return features_stage(
            engine,
            local_store,
            run_id,
            validated,
            None,
            90,
            use_cache=False,
            in_process_rows=limit,
            origins=origins,
        )

    spark_f = features("s", spark, SPARK)
    spark_scoring = _rows(local_store, spark_f.scoring_prefix)  # T's prefix: the next run's too
    local_f = features("l", no_spark, IN_PROCESS)
    assert len(local_f.training_origins) == 3
    assert spark_f.report.spark_jobs and local_f.report.spark_jobs == 0
    figures = ("n_training", "n_scoring", "n_backtest", "events_after_as_of", "features")
    figures += ("training_origins", "backtest_origins")
    assert [getattr(local_f, f) for f in figures] == [getattr(spark_f, f) for f in figures]
    assert local_f.positive_rate == pytest.approx(spark_f.positive_rate, rel=1e-12)
    assert local_f.backtest_prefix and spark_f.backtest_prefix
    for prefix in ("training_prefix", "backtest_prefix"):
        _same_rows(
            _rows(local_store, getattr(spark_f, prefix)),
            _rows(local_store, getattr(local_f, prefix)),
        )
    _same_rows(spark_scoring, _rows(local_store, local_f.scoring_prefix))
    # Spark reads the in-process output with the schema its manifest records (no inference).
    assert read_dataset(spark, local_store, local_f.training_prefix).count() == local_f.n_training

    def snapshot(run_id: str, source, limit: int):
        return preprocess_stage(
            spark, local_store, source, 7, use_cache=False, run_id=run_id, in_process_rows=limit
        )

    spark_p = snapshot("s", spark_f, SPARK)
    local_p = preprocess_stage(
        no_spark, local_store, local_f, 7, use_cache=False, run_id="l", in_process_rows=IN_PROCESS
    )
    assert local_p.report.spark_jobs == 0 and spark_p.report.spark_jobs
    assert local_p.split_counts == spark_p.split_counts
    assert local_p.backtest_split_counts == spark_p.backtest_split_counts
    for prefix in ("snapshot_prefix", "backtest_snapshot_prefix"):
        spark_m = read_dataset_manifest(local_store, getattr(spark_p, prefix))
        local_m = read_dataset_manifest(local_store, getattr(local_p, prefix))
        for key in ("mean", "std"):
            assert local_m.metadata["normalizer"][key] == pytest.approx(
                spark_m.metadata["normalizer"][key], rel=1e-9, abs=1e-12
            )
        assert {f.split("/")[0] for f in local_m.files} == {f.split("/")[0] for f in spark_m.files}
        spark_split = {
            r["customer_id"]: r["split"] for r in read_table(local_store, spark_m).to_pylist()
        }
        local_split = {
            r["customer_id"]: r["split"] for r in read_table(local_store, local_m).to_pylist()
        }
        assert local_split == spark_split
    # The trainer's reader sees the same files per split.
    local_m = read_dataset_manifest(local_store, local_p.snapshot_prefix)
    local_dir = local_store.local_path(local_m.data_prefix)
    assert pq.read_table(local_dir / "split=train").num_rows == local_p.split_counts["train"]
    assert json.dumps(local_p.features) == json.dumps(spark_p.features)


def test_validate_out_of_memory_names_the_settings_and_publishes_nothing(
    local_store, tmp_path, monkeypatch
):
    events = tmp_path / "events"
    generate_demo_events(DemoDataParams(customers=400, days=300, seed=4), events)
    # De-duplicating these 5,450 rows needs 4-5 MB of DuckDB's buffers whatever the input's
    # size: at 4MB about one run in five fitted. 1MB is far below what any input needs.
    monkeypatch.setenv("HYBRIDFLOW_IN_PROCESS_MEMORY", "1MB")
    get_settings.cache_clear()
    try:
        with pytest.raises(HybridflowInputError, match="HYBRIDFLOW_IN_PROCESS_MEMORY") as caught:
            validate_stage(
                no_spark, local_store, "oom", str(events), 0.5, in_process_rows=IN_PROCESS
            )
    finally:
        get_settings.cache_clear()
    assert str(caught.value).startswith(f"validating {events} needs more memory")
    assert "(1MB)" in str(caught.value)
    assert local_store.list(run_dataset_prefix("oom", "events")) == []
    assert local_store.list(run_dataset_prefix("oom", "quarantine")) == []
