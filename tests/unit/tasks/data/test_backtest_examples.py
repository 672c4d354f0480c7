"""The training and backtest examples are point-in-time correct at every origin: whatever happens
after an origin's label window (new events, new customers, more purchases) never changes that
origin's examples. The backtest's origins (T-2H and earlier) all end by T-H, so nothing after T-H
changes the backtest; the training origins all end by T. Checked on Spark SQL and on DuckDB (the
in-process engine), with strides that tile the horizon and strides that overlap it."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from tasks.data.cutoffs import Origins, end_of_day, pipeline_cutoffs
from tasks.data.features import backtest_examples, training_examples
from tasks.data.features_duckdb import InProcessFeatures

pytestmark = pytest.mark.integration  # needs a local Spark session

AS_OF = dt.date(2025, 6, 30)
T_END = end_of_day(AS_OF)
H = 30
COLUMNS = {"event_type", "quantity", "category", "channel"}
SCHEMA = T.StructType(
    [
        T.StructField("customer_id", T.StringType()),
        T.StructField("event_time", T.TimestampType()),
        T.StructField("amount", T.DoubleType()),
        T.StructField("event_type", T.StringType()),
        T.StructField("quantity", T.IntegerType()),
        T.StructField("category", T.StringType()),
        T.StructField("channel", T.StringType()),
    ]
)
ARROW_SCHEMA = pa.schema(
    [
        ("customer_id", pa.string()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("amount", pa.float64()),
        ("event_type", pa.string()),
        ("quantity", pa.int32()),
        ("category", pa.string()),
        ("channel", pa.string()),
    ]
)
PROPERTY = settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
ORIGINS = st.builds(
    Origins, count=st.integers(1, 3), stride_days=st.sampled_from([None, 7, 20, 45])
)
# (customer, days before T-H, amount, type, channel): history up to T-H (5 horizons back)
past_events = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d"]),
        st.floats(0.0, 5.0 * H, allow_nan=False),
        st.floats(0.0, 500.0, allow_nan=False),
        st.sampled_from(["purchase", "purchase", "view", "return"]),
        st.sampled_from(["web", "app"]),
    ),
    min_size=1,
    max_size=25,
)
# events after T-H, up to two horizons later (past T as well), existing or new customers
later_events = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d", "new"]),
        st.floats(1e-3, 2.0 * H, allow_nan=False),
        st.floats(0.0, 500.0, allow_nan=False),
        st.sampled_from(["purchase", "view"]),
        st.sampled_from(["web", "app"]),
    ),
    max_size=25,
)


@pytest.fixture
def one_partition(tiny_spark):
    """Tiny inputs: Spark with one shuffle partition, no re-planning, interpreted expressions."""
    return tiny_spark


def _rows(spec, sign: float, prefix: str, anchor: dt.datetime = T_END - dt.timedelta(days=H)):
    return [
        (prefix + c, anchor - sign * dt.timedelta(days=d), amt, et, 1, "x", ch)
        for c, d, amt, et, ch in spec
    ]


def _keyed(rows) -> dict[tuple[str, dt.date], dict]:
    return {(r["customer_id"], r["origin"]): r for r in rows}


def _spark_examples(spark, rows, origins: Origins, which: str) -> dict[tuple[str, dt.date], dict]:
    df = spark.createDataFrame(rows, SCHEMA, verifySchema=False).repartition(2)
    build = backtest_examples if which == "backtest" else training_examples
    return _keyed(r.asDict() for r in build(df, AS_OF, H, COLUMNS, origins).collect())


def _duckdb_examples(rows, origins: Origins, which: str) -> dict[tuple[str, dt.date], dict]:
    table = pa.Table.from_pylist(
        [
            dict(
                zip(ARROW_SCHEMA.names, (*r[:1], r[1].replace(tzinfo=dt.UTC), *r[2:]), strict=True)
            )
            for r in rows
        ],
        ARROW_SCHEMA,
    )
    run = pipeline_cutoffs(AS_OF, H, origins)
    cutoffs = run.backtest if which == "backtest" else run.train
    with InProcessFeatures(table, cutoffs, COLUMNS, threads=1) as features:
        return _keyed(features.examples_table(cutoffs).to_pylist())


def _same_sides(got: dict[tuple[str, dt.date], dict], keep=lambda origin: True) -> None:
    """Rows of customers ``L|x`` and ``R|x`` at the origins ``keep`` accepts are equal."""
    left = {(k[0][2:], k[1]): v for k, v in got.items() if k[0].startswith("L|") and keep(k[1])}
    right = {(k[0][2:], k[1]): v for k, v in got.items() if k[0].startswith("R|") and keep(k[1])}
    assert set(left) == set(right)  # a customer first seen after an origin has no example at it
    for key, row in left.items():
        assert right[key]["origin"] == row["origin"] == key[1]
        for name, value in row.items():
            if name not in ("customer_id", "origin"):
                assert right[key][name] == pytest.approx(value, rel=1e-12, abs=1e-12), (key, name)


# Spark pays its cost per job, not per row: each example is a batch of up to CASES generated
# cases with one draw of the origins, every case under a customer prefix of its own (examples are
# per customer and origin, so cases never see each other): five jobs per engine check up to 25
# cases where ten jobs checked ten.
CASES = 5


@settings(PROPERTY, max_examples=5)
@given(
    cases=st.lists(st.tuples(past_events, later_events), min_size=1, max_size=CASES),
    origins=ORIGINS,
)
@pytest.mark.slow(
    reason="five Spark jobs of the examples query at up to three origins (each a batch of generated cases)"
)
def test_events_after_t_minus_h_never_change_the_backtest_examples(one_partition, cases, origins):
    rows = []
    for i, (past, later) in enumerate(cases):
        rows += _rows(past, 1.0, f"L|{i}.") + _rows(past, 1.0, f"R|{i}.")
        rows += _rows(later, -1.0, f"R|{i}.")
    for got in (
        _spark_examples(one_partition, rows, origins, "backtest"),
        _duckdb_examples(rows, origins, "backtest"),
    ):
        _same_sides(got)


def test_backtest_examples_are_the_training_examples_of_one_horizon_earlier(one_partition):
    t_minus_h = T_END - dt.timedelta(days=H)
    rows = [
        ("a", t_minus_h - dt.timedelta(days=40), 10.0, "purchase", 1, "x", "web"),  # before T-2H
        ("a", t_minus_h - dt.timedelta(days=5), 20.0, "purchase", 1, "x", "web"),  # label 1
        ("b", t_minus_h - dt.timedelta(days=45), 5.0, "purchase", 1, "x", "app"),
        ("b", t_minus_h + dt.timedelta(days=2), 5.0, "purchase", 1, "x", "app"),  # after T-H
        ("c", t_minus_h - dt.timedelta(days=3), 5.0, "purchase", 1, "x", "app"),  # after T-2H
    ]
    df = one_partition.createDataFrame(rows, SCHEMA)
    got = {r["customer_id"]: r for r in backtest_examples(df, AS_OF, H, COLUMNS).collect()}
    assert set(got) == {"a", "b"} and got["a"]["label"] == 1.0 and got["b"]["label"] == 0.0
    assert got["a"]["recency_days"] == pytest.approx(10.0)  # measured from T-2H
    assert {r["origin"] for r in got.values()} == {(t_minus_h - dt.timedelta(days=H)).date()}
    earlier = training_examples(df, AS_OF - dt.timedelta(days=H), H, COLUMNS)
    assert sorted(map(tuple, earlier.collect())) == sorted(
        map(tuple, backtest_examples(df, AS_OF, H, COLUMNS).collect())
    )


def test_a_customer_is_an_example_at_each_origin_it_was_seen_by(one_partition):
    """Three origins 10 days apart: ``old`` is seen by all three, ``mid`` by the newer two (its
    label at the oldest would need history it does not have), ``new`` by none."""
    origins = Origins(count=3, stride_days=10)
    run = pipeline_cutoffs(AS_OF, H, origins)
    t_minus_h = run.train[0].at
    rows = [
        ("old", t_minus_h - dt.timedelta(days=25), 10.0, "purchase", 1, "x", "web"),
        ("old", t_minus_h - dt.timedelta(days=15), 10.0, "purchase", 1, "x", "web"),
        ("mid", t_minus_h - dt.timedelta(days=15), 10.0, "view", 1, "x", "web"),
        ("new", t_minus_h + dt.timedelta(days=1), 10.0, "purchase", 1, "x", "web"),
    ]
    got = _spark_examples(one_partition, rows, origins, "train")
    days = [c.origin() for c in run.train]
    assert set(got) == {("old", d) for d in days} | {("mid", d) for d in days[:2]}
    # old's purchase 15 days before T-H is inside the oldest origin's label window only
    assert [got[("old", d)]["label"] for d in days] == [0.0, 0.0, 1.0]
    assert [got[("old", d)]["n_purchases"] for d in days] == [2.0, 2.0, 1.0]
    in_process = _duckdb_examples(rows, origins, "train")
    assert set(in_process) == set(got)
    for key, row in got.items():
        values = {k: v for k, v in row.items() if k not in ("customer_id", "origin")}
        assert {k: in_process[key][k] for k in values} == pytest.approx(values, rel=1e-9), key
