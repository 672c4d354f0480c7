"""Point-in-time features: hand-computed values, which features exist for which columns,
properties (appending events after the cutoff / shuffling rows never changes features), the
same data as CSV or Parquet giving the same features, and the features stage's input errors."""

from __future__ import annotations

import datetime as dt
import math
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from infra.compute.spark_io import read_dataset
from infra.errors import HybridflowInputError
from tasks.data.demo_events import DemoDataParams, generate_demo_events
from tasks.data.features import customer_features
from tasks.definitions.contract import CONTRACT_COLUMNS
from tasks.definitions.feature_specs import FEATURE_SPECS, NO_PURCHASE_DAYS, feature_names
from tasks.stages.features import features_stage
from tasks.stages.validate import validate_stage

pytestmark = pytest.mark.integration

CUTOFF = dt.datetime(2025, 6, 30, 23, 59, 59)
ALL_COLUMNS = set(CONTRACT_COLUMNS)
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
DOCS = Path(__file__).parents[4] / "docs" / "data-contract.md"


@pytest.fixture
def small_shuffles(tiny_spark):
    """Tiny inputs: Spark with one shuffle partition, no re-planning, interpreted expressions."""
    return tiny_spark


def _features(spark, rows, columns=ALL_COLUMNS, slices=2) -> dict[str, dict]:
    df = spark.createDataFrame(rows, SCHEMA, verifySchema=False).repartition(slices)
    return {r["customer_id"]: r.asDict() for r in customer_features(df, CUTOFF, columns).collect()}


def _ev(cid, days_before, amount=0.0, etype="purchase", qty=1, cat=None, chan=None):
    return (cid, CUTOFF - dt.timedelta(days=days_before), amount, etype, qty, cat, chan)


def test_feature_values_match_hand_computation(small_shuffles):
    spark = small_shuffles
    rows = [
        _ev("a", 10, 10.0, qty=1, cat="x", chan="web"),
        _ev("a", 7, 20.0, qty=3, cat="x", chan="web"),
        _ev("a", 1, 30.0, qty=2, cat="y", chan="web"),
        _ev("a", 40, etype="view", cat="x", chan="web"),
        _ev("a", -1, 99.0, cat="z", chan="app"),  # after the cutoff: never read
        _ev("b", 400, etype="view", cat=None, chan=None),
    ]
    got = _features(spark, rows)
    a, b = got["a"], got["b"]
    expected_a = {
        "recency_days": 1,
        "tenure_days": 40,
        "n_purchases": 3,
        "purchase_recency_days": 1,
        "purchase_amount_total": 60,
        "purchase_amount_mean": 20,
        "purchases_7d": 1,
        "amount_7d": 30,
        "amount_mean_7d": 30,
        "purchases_30d": 3,
        "amount_30d": 60,
        "amount_mean_30d": 20,
        "purchases_365d": 3,
        "mean_interpurchase_days": 4.5,
        "std_interpurchase_days": 1.5,
        "max_interpurchase_days": 6,
        "purchase_recency_over_gap": 1 / 4.5,
        "trend_30d_vs_365d": 3 * (365 / 30) / 4,
        "trend_amount_90d_vs_365d": 60 * (365 / 90) / 61,
        "basket_size_mean": 2,
        "basket_size_max": 3,
        "n_events": 4,
        "events_30d": 3,
        "share_purchase": 0.75,
        "share_view": 0.25,
        "share_return": 0,
        "n_categories": 2,
        "top_category_share": 0.75,
        "category_entropy": -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)),
        "n_channels": 1,
        "top_channel_share": 1,
        "channel_entropy": 0,
    }
    for name, value in expected_a.items():
        assert a[name] == pytest.approx(value, abs=1e-6), name
    assert b["n_purchases"] == 0 and b["purchase_recency_days"] == NO_PURCHASE_DAYS
    assert b["mean_interpurchase_days"] == NO_PURCHASE_DAYS and b["std_interpurchase_days"] == 0
    assert b["amount_mean_365d"] == 0 and b["basket_size_mean"] == 0
    assert b["n_categories"] == 0 and b["category_entropy"] == 0
    assert b["recency_days"] == pytest.approx(400)
    assert set(a) == {"customer_id", *feature_names(ALL_COLUMNS)}


def test_features_follow_the_columns_present_and_are_documented(small_shuffles):
    spark = small_shuffles
    minimal = {"customer_id", "event_time", "amount"}
    names = feature_names(minimal | {"quantity"})
    dependent = {s.name for s in FEATURE_SPECS if s.needs in ("event_type", "category", "channel")}
    assert "basket_size_mean" in names and not dependent & set(names)
    assert "basket_size_mean" not in feature_names(minimal)
    rows = [_ev("a", 3, 5.0, etype="purchase"), _ev("a", 1, 7.0, etype="purchase")]
    got = _features(spark, rows, minimal | {"quantity"})
    assert list(got["a"]) == ["customer_id", *names]
    assert len(names) == len(set(names)) and len(feature_names(ALL_COLUMNS)) == 46
    doc = DOCS.read_text()
    missing = [s.name for s in FEATURE_SPECS if f"`{s.name}`" not in doc]
    assert not missing, f"features not documented in {DOCS}: {missing}"


events_strategy = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d"]),
        st.floats(min_value=0.0, max_value=500.0, allow_nan=False),
        st.floats(min_value=0.0, max_value=1000.0, allow_nan=False),
        st.sampled_from(["purchase", "purchase", "view", "add_to_cart", "return"]),
        st.integers(min_value=1, max_value=5),
        st.sampled_from([None, "x", "y", "z"]),
        st.sampled_from([None, "web", "app"]),
    ),
    min_size=1,
    max_size=30,
)
PROPERTY = settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


def _rows(spec, sign=1.0, prefix=""):
    return [
        (prefix + c, CUTOFF - sign * dt.timedelta(days=d), amt, et, q, cat, ch)
        for c, d, amt, et, q, cat, ch in spec
    ]


def _split_compare(got: dict[str, dict]) -> None:
    left = {k[2:]: v for k, v in got.items() if k.startswith("L|")}
    right = {k[2:]: v for k, v in got.items() if k.startswith("R|")}
    assert set(left) == set(right)
    for cid, feats in left.items():
        for name, value in feats.items():
            if name != "customer_id":
                assert right[cid][name] == pytest.approx(value, rel=1e-9, abs=1e-9), (cid, name)


# Spark pays its cost per job, not per row: each example is a batch of up to CASES generated
# cases in one job, every case under a customer prefix of its own (features are per customer, so
# cases never see each other). Four jobs check up to 24 cases where ten jobs checked ten.
CASES = 6
BATCHED = settings(PROPERTY, max_examples=4)


@BATCHED
@given(cases=st.lists(st.tuples(events_strategy, events_strategy), min_size=1, max_size=CASES))
def test_events_after_the_cutoff_never_change_features(small_shuffles, cases):
    # The plain history ("L|") and the history plus later events ("R|", including customers
    # seen only later) side by side, every case in the same job.
    rows = _rows([("late", 3.0, 1.0, "purchase", 1, None, None)], -1.0, "R|")
    for i, (past, future) in enumerate(cases):
        future = [(c, d + 1e-3, *rest) for c, d, *rest in future]
        rows += _rows(past, prefix=f"L|{i}.") + _rows(past, prefix=f"R|{i}.")
        rows += _rows(future, -1.0, f"R|{i}.")
    _split_compare(_features(small_shuffles, rows))


@BATCHED
@given(
    cases=st.lists(st.tuples(events_strategy, st.integers(0, 10_000)), min_size=1, max_size=CASES),
    seed=st.integers(0, 10_000),
)
def test_shuffling_input_rows_never_changes_features(small_shuffles, cases, seed):
    rows = []
    for i, (past, case_seed) in enumerate(cases):
        shuffled = list(past)
        random.Random(case_seed).shuffle(shuffled)
        rows += _rows(past, prefix=f"L|{i}.") + _rows(shuffled, prefix=f"R|{i}.")
    random.Random(seed).shuffle(rows)
    _split_compare(_features(small_shuffles, rows, slices=3))


def test_csv_and_parquet_folder_give_identical_features(spark, local_store, tmp_path):
    demo = tmp_path / "demo"
    generate_demo_events(DemoDataParams(customers=150, days=400, seed=5), demo)
    table = pq.read_table(demo)
    hive = tmp_path / "parquet"
    month = pa.compute.strftime(table["event_time"], format="%Y-%m")
    pads.write_dataset(
        table.append_column("month", month),
        hive,
        format="parquet",
        partitioning=["month"],
        partitioning_flavor="hive",
    )
    frame = table.to_pandas()
    frame["event_time"] = frame["event_time"].dt.strftime("%Y-%m-%d %H:%M:%S.%f")
    csv = tmp_path / "csv"
    csv.mkdir()
    half = len(frame) // 2
    frame.iloc[:half].to_csv(csv / "part-1.csv", index=False)
    frame.iloc[half:].to_csv(csv / "part-2.csv", index=False)

    results = {}
    for name, path in (("parquet", hive), ("csv", csv)):
        validated = validate_stage(spark, local_store, name, str(path), 0.05, use_cache=False)
        events = read_dataset(spark, local_store, validated.events_prefix)
        feats = customer_features(events, CUTOFF, set(validated.available_columns))
        results[name] = (validated, {r["customer_id"]: r.asDict() for r in feats.collect()})
    (vp, fp), (vc, fc) = results["parquet"], results["csv"]
    assert vp.quarantine_reasons == vc.quarantine_reasons and vp.rows_valid == vc.rows_valid
    assert vp.available_columns == vc.available_columns
    assert set(fp) == set(fc) and len(fp) > 50
    for cid, feats in fp.items():
        feats.pop("customer_id")
        assert {k: v for k, v in fc[cid].items() if k != "customer_id"} == pytest.approx(
            feats, rel=1e-9
        ), cid


def test_features_stage_errors(spark, local_store, tmp_path):
    path = tmp_path / "events.csv"
    path.write_text(
        "customer_id,event_time,amount\n"
        "c1,2025-01-01 10:00:00,1\nc1,2025-03-01 10:00:00,1\n"
        "c2,2025-01-02 10:00:00,1\nc2,2025-03-02 10:00:00,1\n"
    )
    validated = validate_stage(spark, local_store, "r", str(path), 0.05, use_cache=False)

    def error(as_of, horizon):
        with pytest.raises(HybridflowInputError) as info:
            features_stage(spark, local_store, "r", validated, as_of, horizon, use_cache=False)
        return str(info.value)

    assert "before the first event (2025-01-01)" in error(dt.date(2024, 12, 1), 30)
    assert "no customer has an event in the training window" in error(dt.date(2025, 3, 2), 90)
    message = error(dt.date(2025, 3, 2), 30)
    assert "all 2 training labels are 1" in message and "both buyers and non-buyers" in message
