"""The Spark side of drift on small frames: quantile edges, group-by bin counts that agree with
the pure binning rule whatever the columns per pass, and the unseen-customers anti-join."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from tasks.data.drift import bin_counts, quantile_edges, unseen_count
from tasks.data.stability import NULL_BIN, bin_of, psi

pytestmark = pytest.mark.integration  # needs a local Spark session


@pytest.fixture
def frame(spark):
    rng = np.random.default_rng(3)
    rows = [
        (f"C{i}", float(x), 1.0, None if i % 50 == 0 else float(i % 3))
        for i, x in enumerate(rng.normal(10, 2, 2000))
    ]
    return spark.createDataFrame(rows, "customer_id string, x double, z double, k double")


def test_quantile_edges_split_a_continuous_column_into_equal_bins(frame):
    edges = quantile_edges(frame, ["x", "z"], bins=4, accuracy=10_000)
    assert len(edges["x"]) == 3 and edges["x"] == sorted(edges["x"])
    assert edges["x"][1] == pytest.approx(10, abs=0.3)  # the median of N(10, 2)
    assert edges["z"] == [1.0]  # a constant column: every quantile ties into one edge
    counts = bin_counts(frame, {"x": edges["x"]})["x"]
    assert sorted(counts) == [0, 1, 2, 3]
    assert all(abs(c - 500) <= 25 for c in counts.values()), counts


def test_bin_counts_follow_the_pure_binning_rule_in_one_pass(frame):
    edges = {"x": [8.0, 10.0, 12.0], "k": [0.0, 1.0]}
    counts = bin_counts(frame, edges)
    local = frame.select("x", "k").toPandas()
    for column, column_edges in edges.items():
        expected: dict[int, int] = {}
        for value in local[column]:
            b = bin_of(None if value != value else value, column_edges)
            expected[b] = expected.get(b, 0) + 1
        assert counts[column] == expected, column
    assert counts["k"][NULL_BIN] == 40  # every 50th row has no k
    assert sum(counts["x"].values()) == 2000
    assert bin_counts(frame, edges, columns_per_pass=1) == counts  # passes do not matter


def test_edges_go_to_spark_exactly(spark):
    """Values on, just below and just above awkward edges (inexact decimals, exponents,
    negatives, a backtick in the name) land in the bins the pure rule gives."""
    edges = [-2.5, 1e-05, 0.1, 3.0000000000000004, 1e20]
    values = [None, float("nan"), float("inf"), -float("inf")]
    for edge in edges:
        values += [edge, float(np.nextafter(edge, -np.inf)), float(np.nextafter(edge, np.inf))]
    frame = spark.createDataFrame([(v,) for v in values], "`odd``name` double")
    expected = Counter(bin_of(value, edges) for value in values)
    assert bin_counts(frame, {"odd`name": edges})["odd`name"] == expected


def test_the_same_frame_against_itself_has_no_drift_and_a_shifted_one_has(spark, frame):
    edges = quantile_edges(frame, ["x"], bins=10, accuracy=10_000)
    reference = bin_counts(frame, edges)["x"]
    assert psi(reference, bin_counts(frame, edges)["x"]) == 0.0
    shifted = frame.selectExpr("customer_id", "x + 1.5 AS x")
    assert psi(reference, bin_counts(shifted, edges)["x"]) > 0.25


def test_unseen_count_is_the_customers_the_reference_lacks(spark, frame):
    known = spark.createDataFrame([(f"C{i}",) for i in range(1500)], "customer_id string")
    assert unseen_count(frame, known) == 500
    assert unseen_count(frame, frame) == 0


def test_no_columns_means_no_work(frame):
    assert quantile_edges(frame, [], bins=10, accuracy=100) == {}
    assert bin_counts(frame, {}) == {}


def test_in_memory_edges_and_counts_agree_with_spark_s(frame):
    """The drift reference bins a test split's scores in memory; later checks bin predictions
    in Spark: both sides must cut and count alike."""
    from tasks.data.stability import exact_quantile_edges, sample_bin_counts

    values = np.array([r["x"] for r in frame.select("x").collect()])
    spark_edges = quantile_edges(frame, ["x"], bins=10, accuracy=1_000_000)["x"]
    edges = exact_quantile_edges(values, bins=10)
    assert edges == pytest.approx(spark_edges)
    assert sample_bin_counts(values, edges) == bin_counts(frame, {"x": edges})["x"]
