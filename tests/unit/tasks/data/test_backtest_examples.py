"""The backtest's examples are point-in-time correct: whatever happens after T-H (new events,
new customers, more purchases) never changes them — features at T-2H, labels in (T-2H, T-H]."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from tasks.data.features import backtest_cutoff, backtest_examples, training_examples

pytestmark = pytest.mark.integration  # needs a local Spark session

AS_OF = dt.datetime(2025, 6, 30, 23, 59, 59, 999999)
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
PROPERTY = settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# (customer, days before T-H, amount, type, channel): history up to T-H (3 horizons back)
past_events = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d"]),
        st.floats(0.0, 3.0 * H, allow_nan=False),
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
def one_partition(spark):
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    try:
        yield spark
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)


def _rows(spec, sign: float, prefix: str):
    t_minus_h = AS_OF - dt.timedelta(days=H)
    return [
        (prefix + c, t_minus_h - sign * dt.timedelta(days=d), amt, et, 1, "x", ch)
        for c, d, amt, et, ch in spec
    ]


def _examples(spark, rows) -> dict[str, dict]:
    df = spark.createDataFrame(rows, SCHEMA, verifySchema=False).repartition(2)
    return {
        r["customer_id"]: r.asDict() for r in backtest_examples(df, AS_OF, H, COLUMNS).collect()
    }


@PROPERTY
@given(past=past_events, later=later_events)
def test_events_after_t_minus_h_never_change_the_backtest_examples(one_partition, past, later):
    rows = _rows(past, 1.0, "L|") + _rows(past, 1.0, "R|") + _rows(later, -1.0, "R|")
    got = _examples(one_partition, rows)
    left = {k[2:]: v for k, v in got.items() if k.startswith("L|")}
    right = {k[2:]: v for k, v in got.items() if k.startswith("R|")}
    assert set(left) == set(right)  # a customer first seen after T-2H is not in it at all
    for cid, row in left.items():
        for name, value in row.items():
            if name != "customer_id":
                assert right[cid][name] == pytest.approx(value, rel=1e-12, abs=1e-12), (cid, name)


def test_backtest_examples_are_the_training_examples_of_one_horizon_earlier(one_partition):
    t_minus_h = AS_OF - dt.timedelta(days=H)
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
    assert backtest_cutoff(AS_OF, H) == AS_OF - dt.timedelta(days=2 * H)
    earlier = training_examples(df, AS_OF - dt.timedelta(days=H), H, COLUMNS)
    assert sorted(map(tuple, earlier.collect())) == sorted(
        map(tuple, backtest_examples(df, AS_OF, H, COLUMNS).collect())
    )
