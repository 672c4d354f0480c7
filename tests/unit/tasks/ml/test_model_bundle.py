"""Bundles through the family registry: round trips, checksums, calibration, legacy bundles."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from infra.errors import ChecksumMismatchError, HybridflowInputError
from infra.storage.store import sha256_bytes
from tasks.ml.calibration import Calibration
from tasks.ml.models import (
    CONFIG_FILE,
    bundle_kind,
    family_specs,
    get_family,
    list_families,
    load_model,
    predict_proba,
)
from tasks.ml.models.mlp import WEIGHTS_FILE, CustomerMLP, MLPModel, ModelConfig

LEGACY = Path(__file__).parents[3] / "fixtures" / "bundles" / "mlp-before-families"


def _model():
    torch.manual_seed(0)
    return MLPModel(
        CustomerMLP(
            ModelConfig(
                features=["a", "b"],
                hidden_sizes=[4],
                dropout=0.0,
                norm_mean=[0.0, 1.0],
                norm_std=[1.0, 2.0],
            )
        )
    )


def _sums(files):
    return {k: sha256_bytes(v) for k, v in files.items()}


def test_bundle_round_trip_gives_identical_scores_and_records_its_kind():
    model = _model()
    files = model.bundle_files()
    assert json.loads(files[CONFIG_FILE])["kind"] == "mlp"
    loaded = load_model(files, _sums(files))
    assert isinstance(loaded, MLPModel) and loaded.kind == "mlp"
    x = np.array([[0.0, 1.0], [5.0, -3.0], [100.0, 2.0]], dtype=np.float32)
    np.testing.assert_array_equal(predict_proba(model, x), predict_proba(loaded, x))
    assert ((predict_proba(model, x) >= 0) & (predict_proba(model, x) <= 1)).all()


def test_tampered_bundle_is_refused_before_unpickling():
    files = _model().bundle_files()
    sums = _sums(files)
    files[WEIGHTS_FILE] = files[WEIGHTS_FILE][:-10]
    with pytest.raises(ChecksumMismatchError, match=WEIGHTS_FILE):
        load_model(files, sums)
    with pytest.raises(ChecksumMismatchError, match=CONFIG_FILE):
        load_model({WEIGHTS_FILE: b""}, {})
    good = _model().bundle_files()
    with pytest.raises(ChecksumMismatchError, match="no checksum"):
        load_model({**good, "extra.bin": b"x"}, _sums(good))
    config_only = {CONFIG_FILE: good[CONFIG_FILE]}
    with pytest.raises(ChecksumMismatchError, match=WEIGHTS_FILE):
        load_model(config_only, _sums(config_only))


def test_calibration_travels_inside_the_checksummed_bundle():
    model = _model().with_calibration(Calibration(method="platt", slope=2.0, intercept=-0.5))
    files = model.bundle_files()
    assert json.loads(files[CONFIG_FILE])["calibration"]["method"] == "platt"
    loaded = load_model(files, _sums(files))
    x = np.array([[0.0, 1.0], [5.0, -3.0]], dtype=np.float32)
    np.testing.assert_array_equal(predict_proba(loaded, x), predict_proba(model, x))
    raw = predict_proba(loaded, x, calibrated=False)
    assert not np.allclose(predict_proba(loaded, x), raw)
    # a bundle written before calibration existed loads with the identity map
    config = json.loads(files[CONFIG_FILE])
    del config["calibration"]
    old = {CONFIG_FILE: json.dumps(config).encode(), WEIGHTS_FILE: files[WEIGHTS_FILE]}
    legacy = load_model(old, _sums(old))
    assert legacy.calibration == Calibration()
    np.testing.assert_allclose(predict_proba(legacy, x), raw, atol=1e-12)


def test_a_bundle_written_before_model_families_loads_as_the_mlp_it_is():
    """The fixture was written by the code before this seam (tasks/ml/model.py, no kind)."""
    expected = json.loads((LEGACY / "expected.json").read_text())
    files = {name: (LEGACY / name).read_bytes() for name in (CONFIG_FILE, WEIGHTS_FILE)}
    config = json.loads(files[CONFIG_FILE])
    assert "kind" not in config and bundle_kind(config) == "mlp"
    model = load_model(files, expected["sha256"])
    assert isinstance(model, MLPModel) and model.calibration.method == "temperature"
    x = np.asarray(expected["rows"], dtype=np.float32)
    np.testing.assert_array_equal(predict_proba(model, x), np.asarray(expected["scores"]))
    fast = model.fast_scorer()
    assert fast is not None
    np.testing.assert_allclose(fast(x), expected["scores"], rtol=0, atol=1e-7)


def test_families_are_found_by_kind_and_specs_validated():
    assert "mlp" in list_families()
    assert get_family("mlp").kind == "mlp"
    with pytest.raises(HybridflowInputError, match="unknown model family 'forest'.*mlp"):
        get_family("forest")
    (spec,) = family_specs(["mlp", "mlp"], {"mlp": {"hidden_sizes": [8]}})
    assert spec.kind == "mlp" and spec.hidden_sizes == [8]  # type: ignore[attr-defined]
    with pytest.raises(HybridflowInputError, match="settings of model family 'mlp'"):
        family_specs(["mlp"], {"mlp": {"hidden_size": [8]}})
    with pytest.raises(HybridflowInputError, match="unknown model family forest"):
        family_specs(["mlp"], {"forest": {}})
    with pytest.raises(HybridflowInputError, match="no model family"):
        family_specs([], {})


def test_any_familys_spec_validates_through_the_union_discriminated_on_kind():
    from pydantic import ValidationError

    from tasks.ml.models import spec_adapter
    from tasks.ml.models.gbm import GBMSpec

    adapter = spec_adapter()
    spec = adapter.validate_python({"kind": "gbm", "num_leaves": 15})
    assert isinstance(spec, GBMSpec) and spec.num_leaves == 15
    assert adapter.validate_python({"kind": "mlp"}).hidden_sizes == [64, 32]
    with pytest.raises(ValidationError):
        adapter.validate_python({"kind": "forest"})
    with pytest.raises(ValidationError):
        adapter.validate_python({"kind": "logistic", "l2": 1.0})  # extra fields are refused
