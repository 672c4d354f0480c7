"""Absurd amounts never poison the normaliser (issue 32, item 4): an amount such as 1e308 is
quarantined (``amount_too_large``) by both engines; and a feature with NaN or infinite values is
refused by name (exit 2) before its dataset or a snapshot is published, by the in-process
engines and by Spark."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from infra.compute.spark_io import spark_schema_metadata
from infra.errors import HybridflowInputError
from infra.storage.arrow_datasets import write_table
from infra.storage.datasets import find_dataset
from tasks.data.validation_sql import RowBounds
from tasks.engines.in_process.features import check_finite
from tasks.engines.in_process.snapshot import InProcessSnapshotBuilder
from tasks.engines.spark.snapshot import SparkSnapshotBuilder
from tasks.stages.preprocess import publish_snapshot
from tasks.stages.validate import validate_stage
from tests.unit.tasks.stages.test_event_time_bounds import NOW, _events

BOUNDS = RowBounds.around(NOW, dt.timedelta(hours=24), dt.date(1970, 1, 1), max_amount=1e12)


def test_an_amount_of_1e308_is_quarantined(local_store, tmp_path):
    import pyarrow.parquet as pq

    path = _events(tmp_path / "events.parquet", [])
    table = pq.read_table(path)
    amounts = table["amount"].to_pylist()
    amounts[3], amounts[4] = 1e308, 1e12  # 1e12 is the largest amount kept
    pq.write_table(table.set_column(2, "amount", pa.array(amounts)), path)
    result = validate_stage(None, local_store, "r", str(path), 0.05, bounds=BOUNDS)
    assert result.quarantine_reasons == {"amount_too_large": 1}
    assert result.rows_valid == 95


def _examples(store, values: list[float]) -> str:
    n = len(values)
    table = pa.table(
        {
            "customer_id": [f"c{i}" for i in range(n)],
            "label": [i % 2 for i in range(n)],
            "amount_365d": pa.array(values, pa.float64()),
            "purchases_365d": pa.array([float(i) for i in range(n)], pa.float64()),
            "origin": pa.array([dt.date(2025, 1, 1)] * n, pa.date32()),
        }
    )
    prefix = "runs/r/training_examples"
    write_table(table, store, prefix, metadata=spark_schema_metadata(table.schema))
    return prefix


@pytest.mark.parametrize("engine", ["in_process", "spark"])
def test_the_normaliser_never_sees_a_non_finite_feature(local_store, engine, request):
    spark = request.getfixturevalue("spark") if engine == "spark" else None
    values = [1.0 + i for i in range(200)]
    values[7], values[150] = float("inf"), float("nan")
    prefix = _examples(local_store, values)
    with pytest.raises(HybridflowInputError) as info:
        publish_snapshot(
            SparkSnapshotBuilder(spark) if spark is not None else InProcessSnapshotBuilder(),
            local_store,
            prefix,
            "snapshots/s",
            ["amount_365d", "purchases_365d"],
            seed=7,
            origins=[dt.date(2025, 1, 1)],
        )
    message = str(info.value)
    assert "amount_365d (2 value(s))" in message and "purchases_365d" not in message
    assert "\n" not in message and "no snapshot was published" in message
    assert find_dataset(local_store, "snapshots/s") is None


def test_features_with_infinite_values_are_refused_by_name_before_publishing():
    rows = pa.table(
        {
            "customer_id": ["a", "b", "c"],
            "tenure_days": [1.0, 2.0, 3.0],
            "trend_30d_vs_365d": [0.5, float("inf"), float("-inf")],
        }
    )
    with pytest.raises(HybridflowInputError) as info:
        check_finite(rows, "features/x")
    assert "feature trend_30d_vs_365d has 2 non-finite value(s)" in str(info.value)
    assert "customer b first" in str(info.value)
    check_finite(rows.drop(["trend_30d_vs_365d"]), "features/x")  # finite: no error
