"""The features and preprocess stages give the same outputs in this process (DuckDB, pyarrow)
as with Spark: the same customers, features, labels and figures; the same split of every
customer and the same normaliser; and Spark reads what the in-process stages publish."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from infra.arrow_datasets import read_table
from infra.datasets import read_dataset_manifest
from tasks.data.demo_events import DemoDataParams, generate_demo_events
from tasks.stages.features import features_stage
from tasks.stages.preprocess import preprocess_stage
from tasks.stages.spark_io import read_dataset
from tasks.stages.validate import validate_stage

pytestmark = pytest.mark.integration

SPARK = 0  # in_process_rows that makes both stages use Spark
IN_PROCESS = 10**9


def _rows(store, prefix: str) -> dict[str, dict]:
    table = read_table(store, read_dataset_manifest(store, prefix))
    return {r.pop("customer_id"): r for r in table.to_pylist()}


def _same_rows(expected: dict[str, dict], got: dict[str, dict]) -> None:
    assert list(got) == sorted(got) and set(got) == set(expected) and got
    for cid, values in got.items():
        assert values == pytest.approx(expected[cid], rel=1e-9, abs=1e-9), cid


def test_features_and_snapshot_in_process_equal_spark(spark, local_store, tmp_path):
    events = tmp_path / "events"
    generate_demo_events(DemoDataParams(customers=600, days=500, seed=9), events)
    validated = validate_stage(spark, local_store, "v", str(events), 0.05, use_cache=False)

    def features(run_id: str, limit: int):
        return features_stage(
            spark, local_store, run_id, validated, None, 90, use_cache=False, in_process_rows=limit
        )

    spark_f = features("s", SPARK)
    spark_scoring = _rows(local_store, spark_f.scoring_prefix)  # T's prefix: the next run's too
    local_f = features("l", IN_PROCESS)
    assert spark_f.report.spark_jobs and local_f.report.spark_jobs == 0
    figures = ("n_training", "n_scoring", "n_backtest", "events_after_as_of", "features")
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
    local_p = snapshot("l", local_f, IN_PROCESS)
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
