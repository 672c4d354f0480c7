import json

import numpy as np
import pytest
import torch

from infra.errors import ChecksumMismatchError
from infra.store import sha256_bytes
from tasks.ml.calibration import Calibration
from tasks.ml.model import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    CustomerMLP,
    ModelConfig,
    bundle_bytes,
    load_bundle,
    predict_proba,
    with_calibration,
)
from tasks.ml.promotion import decide_promotion


def _model():
    torch.manual_seed(0)
    return CustomerMLP(
        ModelConfig(
            features=["a", "b"],
            hidden_sizes=[4],
            dropout=0.0,
            norm_mean=[0.0, 1.0],
            norm_std=[1.0, 2.0],
        )
    ).eval()


def test_bundle_round_trip_gives_identical_scores():
    model = _model()
    files = bundle_bytes(model)
    loaded = load_bundle(files, {k: sha256_bytes(v) for k, v in files.items()})
    x = np.array([[0.0, 1.0], [5.0, -3.0], [100.0, 2.0]], dtype=np.float32)
    np.testing.assert_array_equal(predict_proba(model, x), predict_proba(loaded, x))
    assert ((predict_proba(model, x) >= 0) & (predict_proba(model, x) <= 1)).all()


def test_tampered_bundle_is_refused_before_unpickling():
    files = bundle_bytes(_model())
    sums = {k: sha256_bytes(v) for k, v in files.items()}
    files[WEIGHTS_FILE] = files[WEIGHTS_FILE][:-10]
    with pytest.raises(ChecksumMismatchError, match=WEIGHTS_FILE):
        load_bundle(files, sums)
    with pytest.raises(ChecksumMismatchError, match=CONFIG_FILE):
        load_bundle({WEIGHTS_FILE: b""}, {})


def test_gate_decisions():
    assert decide_promotion(0.7, None, 0.0).promote
    assert decide_promotion(0.7, None, 0.0, production_version="m-1", comparable=False).promote
    assert decide_promotion(0.80, 0.78, 0.01, production_version="m-1").promote
    refused = decide_promotion(0.785, 0.78, 0.01, production_version="m-1")
    assert not refused.promote and "does not beat" in refused.reason


def test_calibration_travels_inside_the_checksummed_bundle():
    model = with_calibration(_model(), Calibration(method="platt", slope=2.0, intercept=-0.5))
    files = bundle_bytes(model)
    assert json.loads(files[CONFIG_FILE])["calibration"]["method"] == "platt"
    loaded = load_bundle(files, {k: sha256_bytes(v) for k, v in files.items()})
    x = np.array([[0.0, 1.0], [5.0, -3.0]], dtype=np.float32)
    np.testing.assert_array_equal(predict_proba(loaded, x), predict_proba(model, x))
    raw = predict_proba(loaded, x, calibrated=False)
    assert not np.allclose(predict_proba(loaded, x), raw)
    # a bundle written before calibration existed loads with the identity map
    config = json.loads(files[CONFIG_FILE])
    del config["calibration"]
    old = {CONFIG_FILE: json.dumps(config).encode(), WEIGHTS_FILE: files[WEIGHTS_FILE]}
    legacy = load_bundle(old, {k: sha256_bytes(v) for k, v in old.items()})
    assert legacy.config.calibration == Calibration()
    np.testing.assert_allclose(predict_proba(legacy, x), raw, atol=1e-12)
