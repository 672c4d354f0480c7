"""Feature definitions on tiny hand-written events, with expected values; leakage checks."""

from __future__ import annotations

import datetime as dt

import pytest

from tasks.data.cutoffs import Cutoff
from tasks.data.features import (
    customer_features,
    customer_features_at,
    cutoff_features,
    training_examples,
)
from tasks.definitions.feature_specs import NO_PURCHASE_DAYS, feature_names

pytestmark = pytest.mark.integration  # needs a local Spark session

ALL = {"event_type", "quantity", "category", "channel"}
CUTOFF = dt.datetime(2025, 1, 31, 0, 0)


def _events(spark, rows):
    schema = (
        "customer_id string, event_time timestamp, amount double, event_type string, "
        "quantity int, category string, channel string"
    )
    return spark.createDataFrame(rows, schema)


@pytest.fixture(autouse=True)
def _tiny_inputs(tiny_spark):
    """Tiny inputs: Spark with one shuffle partition, no re-planning, interpreted expressions
    (``TINY_INPUT_SPARK_CONF`` in tests/conftest.py)."""


def _row(cid, day, amount=10.0, etype="purchase", qty=1, cat="home", ch="web"):
    return (cid, dt.datetime(2025, 1, 1) + dt.timedelta(days=day), amount, etype, qty, cat, ch)


@pytest.fixture
def events(spark):
    # A: purchases on Jan 1 (30 days before cutoff), Jan 21 (10 days) and Jan 29 (2 days),
    #    one view on Jan 30; B: a single view on Jan 6 and nothing else.
    return _events(
        spark,
        [
            _row("A", 0, 10.0, qty=1, cat="home", ch="web"),
            _row("A", 20, 20.0, qty=3, cat="toys", ch="app"),
            _row("A", 28, 30.0, qty=2, cat="home", ch="web"),
            _row("A", 29, 0.0, etype="view"),
            _row("B", 5, 0.0, etype="view"),
        ],
    )


def _features(spark, events, cutoff=CUTOFF, available=ALL):
    rows = customer_features(events, cutoff, available).collect()
    return {r["customer_id"]: r.asDict() for r in rows}


def test_rfm_and_windows_by_hand(spark, events):
    f = _features(spark, events)
    a = f["A"]
    assert a["recency_days"] == pytest.approx(1.0)
    assert a["tenure_days"] == pytest.approx(30.0)
    assert a["n_events"] == 4
    assert a["n_purchases"] == 3
    assert a["purchase_recency_days"] == pytest.approx(2.0)
    assert a["purchase_amount_total"] == pytest.approx(60.0)
    assert a["purchase_amount_mean"] == pytest.approx(20.0)
    assert a["mean_interpurchase_days"] == pytest.approx(14.0)  # (30 - 2) / 2
    assert a["basket_size_mean"] == pytest.approx(2.0)
    assert a["purchases_7d"] == 1 and a["amount_7d"] == pytest.approx(30.0)
    assert a["purchases_30d"] == 2  # Jan 1 is exactly 30 days back: outside [0, 30)
    assert a["purchases_90d"] == 3 and a["amount_90d"] == pytest.approx(60.0)
    assert a["events_7d"] == 2
    assert a["share_view"] == pytest.approx(0.25)
    assert a["std_interpurchase_days"] == pytest.approx(6.0)  # gaps 20 and 8 days
    assert a["max_interpurchase_days"] == pytest.approx(20.0)
    assert a["n_channels"] == 2 and a["top_category_share"] == pytest.approx(0.75)
    assert a["trend_30d_vs_365d"] == pytest.approx(2 * (365 / 30) / 4)


def test_customer_without_purchase_gets_documented_stand_ins(spark, events):
    b = _features(spark, events)["B"]
    assert b["n_purchases"] == 0
    assert b["purchase_recency_days"] == NO_PURCHASE_DAYS
    assert b["mean_interpurchase_days"] == NO_PURCHASE_DAYS
    assert b["purchase_amount_mean"] == 0.0
    assert b["recency_days"] == pytest.approx(25.0)


def test_events_after_cutoff_never_change_features(spark, events):
    before = _features(spark, events)
    later = _events(
        spark,
        [_row("A", 31, 999.0), _row("A", 40, 5.0, etype="view"), _row("C", 35, 50.0)],
    )
    after = _features(spark, events.unionByName(later))
    assert after == before  # C only has events after the cutoff: it does not exist yet


def test_optional_columns_drive_the_feature_list(spark):
    minimal = feature_names(set())
    assert "share_view" not in minimal and "n_categories" not in minimal
    full = feature_names(ALL)
    assert set(minimal) < set(full)
    assert len(full) == len(set(full))


def test_labels_come_from_the_horizon_window_only(spark, events):
    def labels(start, end):
        cutoff = Cutoff("c", start, label_until=end)
        wide = customer_features_at(events, [cutoff], ALL)
        return {r["customer_id"]: r["label"] for r in cutoff_features(wide, cutoff, ALL).collect()}

    # features at Jan 20 see A (Jan 1) and B (Jan 6); only A buys in (Jan 20, Jan 25]
    assert labels(dt.datetime(2025, 1, 20), dt.datetime(2025, 1, 25)) == {"A": 1.0, "B": 0.0}
    assert labels(dt.datetime(2025, 1, 22), dt.datetime(2025, 1, 28)) == {"A": 0.0, "B": 0.0}


@pytest.mark.slow(
    reason="Spark runs the wide query once for every cutoff and again for each cutoff alone"
)
def test_every_cutoff_from_one_pass_equals_each_cutoff_alone(spark, events):
    cutoffs = [
        Cutoff("early", dt.datetime(2025, 1, 10), label_until=dt.datetime(2025, 1, 20)),
        Cutoff("train", dt.datetime(2025, 1, 16), label_until=CUTOFF),
        Cutoff("score", CUTOFF),
    ]
    wide = customer_features_at(events, cutoffs, ALL).cache()
    try:
        for cutoff in cutoffs:
            together = {
                r["customer_id"]: r.asDict() for r in cutoff_features(wide, cutoff, ALL).collect()
            }
            alone = _features(spark, events, cutoff.at)
            assert set(together) == set(alone), cutoff.name
            for cid, feats in alone.items():
                got = {k: v for k, v in together[cid].items() if k not in ("label", "customer_id")}
                feats.pop("customer_id")
                assert got == pytest.approx(feats, rel=1e-12), (cutoff.name, cid)
        assert {r["customer_id"] for r in cutoff_features(wide, cutoffs[0], ALL).collect()} == {
            "A",
            "B",
        }
        assert wide.filter("events_after > 0").count() == 0
    finally:
        wide.unpersist()


def test_training_examples_use_features_at_t_minus_h(spark, events):
    as_of = dt.datetime(2025, 1, 31)
    ex = {r["customer_id"]: r for r in training_examples(events, as_of, 15, ALL).collect()}
    # features at Jan 16: A has only its Jan 1 purchase; B its view. A buys on Jan 21 and 29.
    assert ex["A"]["n_purchases"] == 1 and ex["A"]["label"] == 1.0
    assert ex["B"]["label"] == 0.0
