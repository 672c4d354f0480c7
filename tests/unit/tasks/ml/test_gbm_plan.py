"""The gbm family's plan at scale (trees one level deeper at twice the learning rate and half the
early-stopping patience from ``large_fit_rows`` training rows, the production fit's for the
backtest's refit) and its scoring of float32 rows without a float64 copy."""

from __future__ import annotations

import numpy as np
import pytest

from infra.settings import TrainingSettings
from infra.storage.store import LocalFolderStore
from tasks.ml.models import FitJob, get_family, split_arrays
from tasks.ml.models.gbm import GBMModel, GBMPlan, GBMSpec, gbm_plan
from tests.fixtures.synthetic_snapshot import publish_synthetic_snapshot, synthetic_stream


def test_fits_below_large_fit_rows_keep_the_specs_trees():
    spec = GBMSpec()
    assert gbm_plan(spec, 0) == GBMPlan(learning_rate=0.05, num_leaves=31, early_stopping_rounds=30)
    assert gbm_plan(spec, 186_800) == GBMPlan(
        learning_rate=0.05, num_leaves=31, early_stopping_rounds=30
    )  # 300k customers
    assert gbm_plan(spec, spec.large_fit_rows - 1) == GBMPlan(
        learning_rate=0.05, num_leaves=31, early_stopping_rounds=30
    )


def test_large_fits_grow_trees_one_level_deeper_at_twice_the_learning_rate():
    spec = GBMSpec()
    assert spec.large_fit_rows == 500_000
    large = GBMPlan(learning_rate=0.1, num_leaves=63, early_stopping_rounds=15)
    assert gbm_plan(spec, 500_000) == large
    assert gbm_plan(spec, 1_097_638) == large  # the 30M-event run's training rows
    custom = GBMSpec(
        learning_rate=0.7, num_leaves=15, early_stopping_rounds=10, large_fit_rows=1000
    )
    # the rate at most 1; patience: as much learning as 10 rounds at 0.7
    assert gbm_plan(custom, 1000) == GBMPlan(1.0, 31, early_stopping_rounds=7)
    assert gbm_plan(GBMSpec(early_stopping_rounds=1), 10**6).early_stopping_rounds == 1


def test_large_fit_rows_zero_turns_the_plan_off():
    spec = GBMSpec(large_fit_rows=0)
    assert gbm_plan(spec, 30_000_000) == GBMPlan(
        learning_rate=0.05, num_leaves=31, early_stopping_rounds=30
    )


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    store = LocalFolderStore(tmp_path_factory.mktemp("gbm") / "store")
    _, prepared = publish_synthetic_snapshot(store, "gbm", rows=3000, seed=5)
    return synthetic_stream(store, prepared)


@pytest.mark.parametrize(
    ("overrides", "plan_rows", "expected"),
    [
        ({}, None, (0.05, 31, 30)),  # its own ~2,000 rows
        ({"large_fit_rows": 1000}, None, (0.1, 63, 15)),
        ({}, 1_097_638, (0.1, 63, 15)),  # a backtest refit planned for the production fit's rows
    ],
)
def test_a_fit_is_planned_for_its_planned_rows_and_records_the_plan(
    snapshot, overrides, plan_rows, expected
):
    data, normalizer = snapshot
    family = get_family("gbm")
    job = FitJob(
        data=data,
        normalizer=normalizer,
        settings=TrainingSettings(threads=1),
        plan_rows=plan_rows,
    )
    outcome = family.fit(family.spec(overrides | {"max_rounds": 400}), job)
    record = outcome.record
    assert (
        record["learning_rate"],
        record["num_leaves"],
        record["early_stopping_rounds"],
    ) == expected
    booster = outcome.model.booster  # type: ignore[attr-defined]
    params = booster.model_to_string().split("parameters:")[1]
    assert f"[learning_rate: {expected[0]}]" in params
    assert f"[num_leaves: {expected[1]}]" in params
    # stopped by early stopping: the rounds trained after the best one are the patience
    assert booster.num_trees() == record["rounds"] < 400


def test_float32_rows_score_as_their_float64_copies(snapshot):
    data, normalizer = snapshot
    family = get_family("gbm")
    job = FitJob(data=data, normalizer=normalizer, settings=TrainingSettings(threads=1))
    model = family.fit(family.spec({"max_rounds": 20}), job).model
    assert isinstance(model, GBMModel)
    x, _ = split_arrays(data, "test")
    assert x.dtype == np.float32
    z = model.logits(x)
    assert z.dtype == np.float64
    np.testing.assert_array_equal(z, model.logits(x.astype(np.float64)))
    np.testing.assert_array_equal(z[:7], model.logits(np.asfortranarray(x[:7])))
    np.testing.assert_array_equal(
        model.logits(x.astype(np.float16)), model.logits(x.astype(np.float16).astype(np.float64))
    )
