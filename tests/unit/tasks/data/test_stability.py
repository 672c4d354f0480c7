"""PSI, bin edges and statuses on hand-made distributions with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tasks.data.stability import (
    NULL_BIN,
    bin_edges,
    bin_of,
    exact_quantile_edges,
    psi,
    quantile_probabilities,
    sample_bin_counts,
    score_band_edges,
    shares,
    status,
)

UNIFORM = {0: 100, 1: 100, 2: 100, 3: 100}


def test_identical_distributions_have_zero_psi():
    assert psi(UNIFORM, UNIFORM) == 0.0
    # the same shares at another size are the same distribution
    assert psi(UNIFORM, {k: 7 * v for k, v in UNIFORM.items()}) == pytest.approx(0.0, abs=1e-12)


def test_psi_matches_the_formula_by_hand():
    actual = {0: 200, 1: 100, 2: 50, 3: 50}  # shares .5 .25 .125 .125 against .25 each
    by_hand = sum((a - 0.25) * math.log(a / 0.25) for a in (0.5, 0.25, 0.125, 0.125))
    assert psi(UNIFORM, actual) == pytest.approx(by_hand)
    assert by_hand == pytest.approx(0.3466, abs=1e-4)


def test_a_shifted_distribution_is_above_the_threshold_and_a_small_wobble_is_not():
    shifted = {0: 40, 1: 60, 2: 140, 3: 160}
    wobble = {0: 95, 1: 105, 2: 98, 3: 102}
    assert status(psi(UNIFORM, shifted), 0.25) == "drift"
    assert psi(UNIFORM, wobble) < 0.01
    assert status(psi(UNIFORM, wobble), 0.25) == "ok"


def test_psi_is_symmetric_in_its_two_sides():
    other = {0: 10, 1: 30, 2: 60}
    assert psi(UNIFORM, other) == pytest.approx(psi(other, UNIFORM))


def test_a_new_category_counts_as_min_share_in_the_reference():
    reference = {"web": 500, "store": 500}
    new = {"web": 400, "store": 400, "app": 200}
    value = psi(reference, new, min_share=1e-4)
    # the new category alone contributes (0.2 - 1e-4) * ln(0.2 / 1e-4)
    assert value > (0.2 - 1e-4) * math.log(0.2 / 1e-4)
    assert math.isfinite(value) and status(value, 0.25) == "drift"


def test_an_empty_bin_stays_finite_and_min_share_sets_how_much_it_weighs():
    actual = {0: 100, 1: 100, 2: 100, 3: 0}
    small = psi(UNIFORM, actual, min_share=1e-4)
    large = psi(UNIFORM, actual, min_share=1e-2)
    assert math.isfinite(small) and math.isfinite(large)
    assert small > large > 0


def test_an_empty_distribution_is_refused():
    with pytest.raises(ValueError, match="empty"):
        psi(UNIFORM, {})
    with pytest.raises(ValueError, match="empty"):
        shares({0: 0}, [0], 1e-4)


def test_bin_edges_drop_ties_and_missing_quantiles():
    assert bin_edges([0.0, 0.0, 0.0, 1.0, 1.0, 3.5, None, float("nan")]) == [0.0, 1.0, 3.5]
    assert bin_edges([]) == []


def test_a_value_s_bin_is_the_number_of_edges_below_it():
    edges = [0.0, 1.0, 3.5]
    assert [bin_of(v, edges) for v in (-2.0, 0.0, 0.5, 1.0, 2.0, 3.5, 9.0)] == [0, 0, 1, 1, 2, 2, 3]
    assert bin_of(None, edges) == NULL_BIN and bin_of(float("nan"), edges) == NULL_BIN
    assert bin_of(5.0, []) == 0


def test_quantile_probabilities_split_into_equal_parts():
    assert quantile_probabilities(4) == [0.25, 0.5, 0.75]
    with pytest.raises(ValueError, match="2 bins"):
        quantile_probabilities(1)


def test_status_reads_the_threshold_strictly():
    assert status(0.25, 0.25) == "ok"
    assert status(0.2501, 0.25) == "drift"
    assert status(None, 0.25) == "n/a"


def test_a_sample_is_binned_as_each_value_is_and_missing_values_get_the_null_bin():
    values = np.array([0.1, 0.5, 0.5, 0.9, np.nan, 2.0])
    edges = exact_quantile_edges(values, bins=4)
    assert edges == [0.5, 0.9]  # ties collapse; the NaN takes no part in the quantiles
    counts = sample_bin_counts(values, edges)
    expected: dict[int, int] = {}
    for v in values:
        b = bin_of(None if np.isnan(v) else float(v), edges)
        expected[b] = expected.get(b, 0) + 1
    assert counts == expected == {0: 3, 1: 1, 2: 1, NULL_BIN: 1}
    assert exact_quantile_edges(np.array([np.nan]), bins=4) == []


def test_score_bands_merge_quantiles_closer_than_a_step_and_leave_out_0_and_1():
    scores = np.array([0.001, 0.002, 0.003, 0.004, 0.2, 0.21, 0.5, 0.8, 0.999, 0.9999])
    assert exact_quantile_edges(scores, bins=5)[:2] == [0.002, 0.004]
    assert score_band_edges(scores, bins=5, resolution=0.01) == [0.21, 0.8]
    assert score_band_edges(np.array([0.0, 0.0, 1.0, 1.0]), bins=2, resolution=0.01) == []


def test_score_psi_in_bands_ignores_reshuffles_below_one_step_but_not_moves_across_bands():
    rng = np.random.default_rng(3)
    reference = np.concatenate([rng.uniform(0.001, 0.006, 600), rng.uniform(0.05, 0.95, 400)])
    # the same population, its near-zero scores 40% lower: quantiles would flag it
    aged = np.where(reference < 0.01, reference * 0.6, reference)
    quantiles = exact_quantile_edges(reference, bins=10)
    bands = score_band_edges(reference, bins=10, resolution=0.01)

    def measure(edges, actual):
        return psi(sample_bin_counts(reference, edges), sample_bin_counts(actual, edges))

    assert measure(quantiles, aged) > 1.0
    assert measure(bands, aged) < 0.01
    moved = np.where(reference > 0.5, reference - 0.3, reference)  # high scorers drop a lot
    assert measure(bands, moved) > 0.25


def _sorted_quantile_edges(values: np.ndarray, bins: int) -> list[float]:
    """The definition, by a full sort: the smallest value with at least each share at or below."""
    ordered = np.sort(values[np.isfinite(values)])
    n = ordered.size
    quantiles = [
        ordered[min(n - 1, max(0, math.ceil(p * n) - 1))] for p in quantile_probabilities(bins)
    ]
    return bin_edges(float(q) for q in quantiles) if n else []


@pytest.mark.parametrize("seed", range(6))
def test_quantile_edges_and_bin_counts_are_those_of_a_full_sort_and_one_value_at_a_time(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3_000))
    values = rng.choice([0.0, 1.0, 2.5], n) if seed % 2 else rng.lognormal(0, 2, n)
    values[rng.random(n) < 0.05] = np.nan
    values[rng.random(n) < 0.01] = np.inf
    for bins in (2, 7, 10, 40, 64):
        edges = exact_quantile_edges(values, bins)
        assert edges == _sorted_quantile_edges(values, bins)
        expected: dict[int, int] = {}
        for v in values:
            b = bin_of(None if np.isnan(v) else float(v), edges)
            expected[b] = expected.get(b, 0) + 1
        counts = sample_bin_counts(values, edges)
        assert counts == expected
        assert list(counts) == sorted(counts)  # the null bin first, then by bin
    assert sample_bin_counts(np.array([]), [1.0]) == {}
