"""The fast single-request scoring path gives what predict_proba gives."""

from __future__ import annotations

import numpy as np
import torch

from serving.scorer import fast_scorer
from tasks.ml.calibration import Calibration
from tasks.ml.models import predict_proba
from tasks.ml.models.mlp import CustomerMLP, MLPModel, ModelConfig
from tests.fixtures.serving_sample import sample_feature_table, sample_model


def test_fast_path_matches_predict_proba():
    table = sample_feature_table(50, seed=2)
    model = sample_model(table, seed=4, hidden_sizes=[16, 8, 4])
    x = np.random.default_rng(1).exponential(20.0, size=(64, len(model.features)))
    fast = fast_scorer(model)
    assert fast is not None
    np.testing.assert_allclose(fast(x), predict_proba(model, x), rtol=0, atol=1e-7)
    np.testing.assert_allclose(fast(x[:1]), predict_proba(model, x[:1]), rtol=0, atol=1e-7)


def test_models_in_training_mode_or_of_other_shapes_get_no_fast_path():
    config = ModelConfig(
        features=["a", "b"], hidden_sizes=[4], dropout=0.5, norm_mean=[0, 0], norm_std=[1, 1]
    )
    model = MLPModel(CustomerMLP(config))
    model.network.train()
    assert fast_scorer(model) is None  # training mode: dropout active
    model.network.eval()
    assert fast_scorer(model) is not None
    model.network.net.append(torch.nn.Tanh())
    assert fast_scorer(model) is None


def test_fast_path_applies_the_bundle_calibration():
    table = sample_feature_table(40, seed=3)
    model = sample_model(table, seed=5, hidden_sizes=[8])
    x = np.random.default_rng(2).exponential(10.0, size=(32, len(model.features)))
    raw = fast_scorer(model)(x)
    for calibration in (
        Calibration(method="platt", slope=0.5, intercept=-1.0),
        Calibration(
            method="isotonic", knots_logit=[-1.0, 0.0, 1.0], knots_probability=[0.1, 0.2, 0.6]
        ),
    ):
        model.with_calibration(calibration)
        fast = fast_scorer(model)
        expected = calibration.probabilities(model.logits(x))
        np.testing.assert_allclose(fast(x), expected, rtol=0, atol=1e-12)
        np.testing.assert_allclose(predict_proba(model, x), expected, rtol=0, atol=1e-12)
        assert np.abs(fast(x) - raw).max() > 0.01  # the calibration really changed the scores
