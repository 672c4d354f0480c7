import numpy as np
import pytest

from tasks.ml.metrics import (
    _roc_auc_sorted,
    classification_metrics,
    descending,
    log_loss,
    pr_auc,
    roc_auc,
)


def test_roc_auc_perfect_and_inverted():
    y = np.array([0, 0, 1, 1])
    assert roc_auc(y, np.array([0.1, 0.2, 0.8, 0.9])) == 1.0
    assert roc_auc(y, np.array([0.9, 0.8, 0.2, 0.1])) == 0.0


def test_roc_auc_ties_count_half():
    y = np.array([0, 1])
    assert roc_auc(y, np.array([0.5, 0.5])) == 0.5


def test_roc_auc_matches_pairwise_definition():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    s = rng.normal(size=200) + y
    pos, neg = s[y == 1], s[y == 0]
    pairwise = ((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean()
    assert roc_auc(y, s) == pytest.approx(pairwise)


def test_pr_auc_known_value():
    # ranks: 1(pos) 2(neg) 3(pos): AP = (1/1 + 2/3) / 2
    assert pr_auc(np.array([1, 0, 1]), np.array([0.9, 0.8, 0.7])) == pytest.approx((1 + 2 / 3) / 2)


def test_log_loss_of_prior():
    y = np.array([1, 0, 0, 0])
    assert log_loss(y, np.full(4, 0.25)) == pytest.approx(-(np.log(0.25) + 3 * np.log(0.75)) / 4)


def test_single_class_is_an_error():
    with pytest.raises(ValueError, match="both classes"):
        roc_auc(np.ones(3), np.array([0.1, 0.2, 0.3]))


def test_classification_metrics_keys():
    m = classification_metrics(np.array([0, 1, 1, 0]), np.array([0.2, 0.7, 0.6, 0.4]))
    assert set(m) == {"auc", "pr_auc", "logloss", "positive_rate"}


def test_roc_auc_with_many_ties_matches_pairwise_definition():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 300)
    s = np.round(rng.normal(size=300) + y, 1)  # tie groups of mixed labels
    pos, neg = s[y == 1], s[y == 0]
    pairwise = ((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean()
    assert roc_auc(y, s) == pytest.approx(pairwise, abs=1e-12)


def test_roc_auc_is_the_same_whatever_order_a_tie_group_is_sorted_in():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 50_000).astype(float)
    s = np.round(rng.normal(size=50_000) + y, 2)  # large tie groups of both labels
    stable = descending(s)
    assert roc_auc(y, s) == _roc_auc_sorted(y[stable], s[stable])  # bit for bit
