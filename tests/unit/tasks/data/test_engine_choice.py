"""The engine choice table: one pure function decides every CPU stage's engine from the input's
size and layout, the cluster or not, and the in-process limit (the setting or an override)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.data.engine_choice import (
    IN_PROCESS,
    SPARK,
    SPARK_PER_BUCKET,
    SPARK_PER_PARTITION,
    EngineInputs,
    choose_engine,
    run_needs_spark,
)
from tasks.data.input_formats import InputOptions, inspect_events
from tasks.stages.validate import engine_inputs

LIMIT = 1_000

TABLE = [
    # stage, rows, cluster, layout problem, clustered by customer -> engine
    ("validate", 10, False, None, False, IN_PROCESS),
    ("validate", LIMIT, False, None, False, IN_PROCESS),  # the limit is inclusive
    ("validate", LIMIT + 1, False, None, False, SPARK),
    ("validate", 10, False, "CSV input: Spark parses it", False, SPARK),
    ("validate", 10, True, None, False, IN_PROCESS),  # small input stays here on a cluster too
    ("features", 10, False, None, True, IN_PROCESS),
    ("features", LIMIT + 1, False, None, True, SPARK_PER_BUCKET),
    ("features", LIMIT + 1, True, None, True, SPARK_PER_BUCKET),
    # not clustered (an S3 store's executors wrote them): a shuffle, DuckDB per partition
    ("features", LIMIT + 1, True, None, False, SPARK_PER_PARTITION),
    ("features", LIMIT + 1, False, None, False, SPARK_PER_PARTITION),
    ("preprocess", 10, False, None, True, IN_PROCESS),
    ("preprocess", LIMIT + 1, False, None, True, SPARK),  # no per-bucket engine
    ("batch_inference", 10, False, None, False, IN_PROCESS),
    ("batch_inference", 10, True, None, False, SPARK),  # a cluster's executors score
    ("batch_inference", LIMIT + 1, False, None, False, SPARK),
    ("drift", 10, True, None, False, IN_PROCESS),
    ("drift", LIMIT + 1, False, None, False, SPARK),
]


@pytest.mark.parametrize(("stage", "rows", "cluster", "problem", "clustered", "engine"), TABLE)
def test_the_engine_choice_table(stage, rows, cluster, problem, clustered, engine):
    inputs = EngineInputs(
        rows=rows,
        limit=LIMIT,
        cluster=cluster,
        layout_problem=problem,
        clustered_by_customer=clustered,
    )
    choice = choose_engine(stage, inputs)
    assert choice.engine == engine, choice
    assert choice.reason  # every choice says why


def test_the_reason_names_what_decided():
    assert choose_engine("validate", EngineInputs(rows=5, limit=10)).reason == (
        "5 rows <= in-process limit 10"
    )
    problem = "column event_time is a string: Spark parses it"
    assert choose_engine(
        "validate", EngineInputs(rows=5, limit=10, layout_problem=problem)
    ).reason == (problem)
    big = choose_engine("features", EngineInputs(rows=20, limit=10, clustered_by_customer=True))
    assert big.reason == "20 rows > in-process limit 10; clustered by customer"
    plain = choose_engine("features", EngineInputs(rows=20, limit=10, cluster=True))
    assert plain.reason == (
        "20 rows > in-process limit 10; not clustered by customer (on a cluster): one shuffle "
        "by customer, then DuckDB per partition"
    )


@pytest.mark.parametrize(
    ("limit", "engine"),
    [(0, SPARK), (10**12, IN_PROCESS)],  # 0: always Spark; a huge override: always here
    ids=["always-spark", "always-in-process"],
)
def test_an_override_of_the_limit_wins(limit, engine):
    for stage in ("validate", "features", "preprocess", "batch_inference", "drift"):
        # features on Spark: DuckDB per partition of the (unclustered) events
        want = SPARK_PER_PARTITION if (stage, engine) == ("features", SPARK) else engine
        assert choose_engine(stage, EngineInputs(rows=1, limit=limit)).engine == want


def test_a_run_needs_spark_when_any_cpu_stage_would_run_there():
    assert not run_needs_spark(EngineInputs(rows=10, limit=LIMIT))
    assert run_needs_spark(EngineInputs(rows=10, limit=LIMIT, cluster=True))  # batch inference
    assert run_needs_spark(EngineInputs(rows=LIMIT + 1, limit=LIMIT))
    assert run_needs_spark(EngineInputs(rows=10, limit=LIMIT, layout_problem="CSV input"))


def test_a_reason_says_when_the_rows_are_an_estimate():
    estimated = EngineInputs(rows=5, limit=10, rows_estimated=True)
    assert choose_engine("validate", estimated).reason == "about 5 rows <= in-process limit 10"
    over = estimated.model_copy(update={"rows": 20})
    assert choose_engine("validate", over).reason == "about 20 rows > in-process limit 10"


def test_csv_rows_are_estimated_parquet_rows_counted(tmp_path):
    """A CSV file's rows come from its size (a 6,453-row shop export read as 4,823 rows in the
    stage's report); a Parquet file's from its footer."""
    csv = tmp_path / "events.csv"
    csv.write_text("customer_id,event_time,amount\n" + "c1,2025-01-01,1.5\n" * 3)
    parquet = tmp_path / "events.parquet"
    columns = {"customer_id": ["c1"] * 3, "event_time": ["2025-01-01"] * 3, "amount": [1.5] * 3}
    pq.write_table(pa.table(columns), parquet)
    from_csv = engine_inputs(inspect_events(csv, InputOptions()), limit=10)
    from_parquet = engine_inputs(inspect_events(parquet, InputOptions()), limit=10)
    assert from_csv.rows_estimated and not from_parquet.rows_estimated
    assert from_parquet.rows == 3
    assert choose_engine("validate", from_csv).reason.startswith("about ")
