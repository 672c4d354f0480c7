"""The CPU stages use the engine as one pass: a budget of Spark jobs per stage, one shuffle of
the events in validate and none in features (the physical plans say so), and the figures the
stages report come from the writes, not from reading the outputs again."""

from __future__ import annotations

import datetime as dt

import pyarrow.parquet as pq
import pytest

from infra.compute.spark_io import SparkJobs, read_dataset
from infra.storage.datasets import read_dataset_manifest
from tasks.data.cutoffs import Origins, pipeline_cutoffs
from tasks.data.demo_events import DemoDataParams, generate_demo_events
from tasks.data.features import customer_features_at
from tasks.data.input_formats import InputOptions, read_events
from tasks.data.validation import conform_events, split_valid_events
from tasks.stages.features import features_stage
from tasks.stages.preprocess import preprocess_stage
from tasks.stages.validate import validate_stage

pytestmark = pytest.mark.integration

# Spark jobs per stage on a small input with the backtest (three origins each: the extra
# origins come out of the same pass), measured when the stages became one pass (before: validate 17, features 34 + 3 for the backtest, preprocess 10 + 10). Validate:
# the input's schema, the shuffle, the events write, the quarantine write; features: one task
# per bucket of the events, writing every output (4 with Spark SQL: the customer-level frame
# kept in memory, then the three writes); preprocess: the snapshot write and the backtest
# snapshot's. (Reads of published datasets take their schema from the manifest: no job.)
JOB_BUDGET = {"validate": 4, "features": 1, "preprocess": 2}
# Up to ``in_process_rows`` (and for validate, Parquet in native types) the stages run no
# Spark job at all.
IN_PROCESS_BUDGET = {"validate": 0, "features": 0, "preprocess": 0}
ENGINES = pytest.mark.parametrize(
    "in_process_rows, budget", [(0, JOB_BUDGET), (10**9, IN_PROCESS_BUDGET)], ids=["spark", "local"]
)


@pytest.fixture(scope="module")
def small_events(tmp_path_factory):
    out = tmp_path_factory.mktemp("one-pass") / "events"
    generate_demo_events(DemoDataParams(customers=300, days=400, seed=21), out)
    return out


def _plan(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


def _shuffles(df) -> int:
    """Shuffles in the lineage of ``df`` (through the checkpoint validate keeps its rows in)."""
    lineage = df._jdf.queryExecution().toRdd().toDebugString()
    return sum("ShuffledRowRDD" in line for line in lineage.splitlines())


@pytest.mark.slow(
    reason="validate, features and preprocess on Spark with the backtest at three origins, counting their jobs"
)
@ENGINES
def test_job_budget_per_stage_and_figures_from_the_writes(
    spark, local_store, small_events, in_process_rows, budget
):
    validated = validate_stage(
        spark,
        local_store,
        "r",
        str(small_events),
        0.05,
        use_cache=False,
        in_process_rows=in_process_rows,
    )
    features = features_stage(
        spark,
        local_store,
        "r",
        validated,
        None,
        90,
        False,
        in_process_rows=in_process_rows,
        origins=Origins(count=3, stride_days=60),
    )
    snapshot = preprocess_stage(
        spark, local_store, features, 7, use_cache=False, in_process_rows=in_process_rows
    )
    jobs = {r.name: r.spark_jobs for r in (validated.report, features.report, snapshot.report)}
    over = {name: n for name, n in jobs.items() if n is None or n > budget[name]}
    assert not over, f"Spark jobs over budget {budget}: {jobs}"
    # each stage's report says which engine the one choice picked, and why
    reports = (validated.report, features.report, snapshot.report)
    engines = {r.name: r.engine for r in reports}
    if in_process_rows == 0:
        assert engines == {
            "validate": "spark",
            "features": "spark-per-bucket",
            "preprocess": "spark",
        }
    else:
        assert set(engines.values()) == {"in-process"}, engines
    assert all(r.engine_reason for r in reports)

    # The observed figures match what was written.
    events = read_dataset(spark, local_store, validated.events_prefix)
    assert events.count() == validated.rows_valid
    assert validated.rows_read == pq.read_metadata(next(small_events.iterdir())).num_rows
    quarantine = read_dataset(spark, local_store, validated.quarantine_prefix)
    reasons = {r["reason"]: r["count"] for r in quarantine.groupBy("reason").count().collect()}
    assert reasons == validated.quarantine_reasons and sum(reasons.values()) > 0
    span = events.selectExpr("min(event_time) AS lo", "max(event_time) AS hi").first()
    assert span["lo"].date() == validated.first_event.date()
    assert span["hi"].date() == validated.last_event.date()
    examples = read_dataset(spark, local_store, features.training_prefix)
    assert examples.count() == features.n_training
    rate = examples.selectExpr("avg(label) AS r").first()["r"]
    assert features.positive_rate == pytest.approx(rate, rel=1e-12)
    assert features.backtest_prefix is not None, features.backtest_skipped  # 400 days > 2 x 90
    backtest = read_dataset(spark, local_store, features.backtest_prefix)
    assert backtest.count() == features.n_backtest
    rate = backtest.selectExpr("avg(label) AS r").first()["r"]
    assert features.backtest_positive_rate == pytest.approx(rate, rel=1e-12)
    for prefix, observed in (
        (snapshot.snapshot_prefix, snapshot.split_counts),
        (snapshot.backtest_snapshot_prefix, snapshot.backtest_split_counts),
    ):
        split = read_dataset(spark, local_store, prefix)
        counts = {r["split"]: r["count"] for r in split.groupBy("split").count().collect()}
        assert counts == observed
    manifest = read_dataset_manifest(local_store, snapshot.snapshot_prefix)
    assert len(manifest.metadata["normalizer"]["mean"]) == len(features.features)


def test_one_shuffle_in_validate_none_in_features(spark, local_store, small_events):
    raw = read_events(spark, small_events, InputOptions())
    parts = split_valid_events(conform_events(raw.df, raw.timestamp_format), 2)
    try:
        assert _shuffles(parts.good) == 1
        assert _shuffles(parts.quarantine) == 1
    finally:
        parts.release()
    validated = validate_stage(
        spark, local_store, "r", str(small_events), 0.05, use_cache=False, in_process_rows=0
    )
    events = read_dataset(spark, local_store, validated.events_prefix)
    cutoffs = pipeline_cutoffs(validated.last_event.date(), 90, Origins(count=3)).distinct()
    # with the sequences' window over each customer's events too
    wide = customer_features_at(events, cutoffs, set(validated.available_columns), 8)
    plan = _plan(wide)
    assert "Bucketed: true" in plan and _shuffles(wide) == 0
    assert "Exchange" not in plan, plan  # no shuffle, and no broadcast either


@ENGINES
def test_events_after_as_of_are_counted_from_the_features_frame(
    spark, local_store, tmp_path, in_process_rows, budget
):
    path = tmp_path / "events.csv"
    lines = ["customer_id,event_time,amount,event_type"]
    for day in range(1, 28):
        lines.append(f"a,2025-01-{day:02d} 10:00:00,1,purchase")
        lines.append(f"b,2025-01-{day:02d} 11:00:00,1,{'view' if day % 2 else 'purchase'}")
    lines += [f"d,2025-01-0{day} 09:00:00,1,purchase" for day in range(1, 6)]
    lines += ["c,2025-02-20 10:00:00,1,purchase", "a,2025-02-21 10:00:00,1,purchase"]
    path.write_text("\n".join(lines) + "\n")
    validated = validate_stage(spark, local_store, "r", str(path), 0.05, use_cache=False)
    result = features_stage(
        spark,
        local_store,
        "r",
        validated,
        dt.date(2025, 1, 20),
        10,
        use_cache=False,
        in_process_rows=in_process_rows,
    )
    # a and b: 7 events each in late January; a's one and c's one in February (a customer
    # seen only after T still counts), counted by the tasks that compute the features.
    assert result.events_after_as_of == 2 * 7 + 2
    assert result.n_scoring == 3 and result.n_training == 3  # a, b, d; d never buys again
    assert result.report.spark_jobs == budget["features"]
    with SparkJobs(spark) as jobs:
        latest = features_stage(
            spark, local_store, "r", validated, None, 40, False, in_process_rows=in_process_rows
        )
    assert latest.events_after_as_of == 0 and jobs.count == latest.report.spark_jobs
