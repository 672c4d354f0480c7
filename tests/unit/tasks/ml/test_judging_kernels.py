"""The judging's shared work and its numeric kernels: every contender of a run is judged on the
same rows beside the same baseline, so the baseline's figures are computed once per process;
the identity calibration's figures are the raw model's; ``signed_log1p`` and ``sigmoid``, which
every fit and scoring pass runs on every chunk, give the textbook formulas' values bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from infra.compute.devices import Device
from infra.settings import TrainingSettings
from infra.storage.store import LocalFolderStore
from tasks.ml import backtest as backtest_module
from tasks.ml import snapshot_reader
from tasks.ml.backtest import assess, baseline_of, scored_rows
from tasks.ml.calibration import fit_calibration
from tasks.ml.logistic import sigmoid
from tasks.ml.metrics import quality_metrics
from tasks.ml.models import FitJob, get_family
from tasks.ml.normalizer import Normalizer, signed_log1p
from tasks.ml.snapshot_reader import SnapshotStream
from tests.fixtures.synthetic_snapshot import publish_synthetic_snapshot, synthetic_stream

EDGES = [0.0, -0.0, 1e-300, -1e-300, 1e-8, -1e-8, 0.5, -0.5, 3.0, -700.0, 800.0]
EDGES += [1e308, -1e308, np.inf, -np.inf, np.nan]


def _textbook_signed_log1p(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.sign(x) * np.log1p(np.abs(x))


def _two_branch_sigmoid(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    out = np.empty_like(z)
    pos = z >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-z[pos]))
    e = np.exp(z[~pos])
    out[~pos] = e / (1.0 + e)
    return out


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtypes, shapes and bits (the sign of a zero included), NaN where the other is NaN
    (whatever its payload)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b))) and a[~nan].tobytes() == b[~nan].tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_signed_log1p_gives_the_formulas_values_bit_for_bit_and_leaves_its_input(dtype):
    rng = np.random.default_rng(4)
    scale = 10.0 ** rng.integers(-6, 9, size=5000)
    with np.errstate(over="ignore"):  # 1e308 is inf in float32
        x = np.concatenate([np.array(EDGES), rng.standard_normal(5000) * scale]).astype(dtype)
    x = np.resize(x, (1003, 5))  # a chunk's shape: rows by features
    before = x.copy()
    got = signed_log1p(x)
    assert _same_bits(got, _textbook_signed_log1p(x))  # -0.0 -> 0.0 and NaN as the formula
    assert _same_bits(x, before)


def test_sigmoid_gives_the_two_branch_formulas_values_bit_for_bit():
    rng = np.random.default_rng(5)
    z = np.concatenate([np.array(EDGES), rng.standard_normal(20_000) * 30.0])
    assert _same_bits(sigmoid(z), _two_branch_sigmoid(z))
    with np.errstate(over="ignore"):  # 1e308 is inf in float32
        z32 = z.astype(np.float32)
    assert _same_bits(sigmoid(z32), _two_branch_sigmoid(z32))


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    store = LocalFolderStore(tmp_path_factory.mktemp("judging-store"))
    _, prepared = publish_synthetic_snapshot(store, "judged", rows=4000, seed=8)
    return synthetic_stream(store, prepared, chunk_rows=700)


def _fitted(kind: str, data: SnapshotStream, normalizer: Normalizer):
    family = get_family(kind)
    job = FitJob(data=data, normalizer=normalizer, settings=TrainingSettings(), device=Device())
    return family.fit(family.spec({}), job).model


def test_every_contender_is_judged_beside_one_baseline_computed_once(snapshot, monkeypatch):
    data, normalizer = snapshot
    models = [_fitted(kind, data, normalizer) for kind in ("rfm", "logistic")]
    judged_rows = scored_rows(None, data, ["test"])
    expected = quality_metrics(
        judged_rows.labels, baseline_of(data).predict_proba(judged_rows.baseline_x)
    )
    monkeypatch.setattr(snapshot_reader, "_memo", {})
    calls: list[int] = []
    real = backtest_module.quality_metrics

    def counted(labels, probabilities):
        calls.append(len(labels))
        return real(labels, probabilities)

    monkeypatch.setattr(backtest_module, "quality_metrics", counted)
    comparisons = []
    for model in models:
        calls.clear()
        calibration, comparison = assess(model, data, data, ["test"], "none")
        assert calibration.method == "none"
        comparisons.append((comparison, len(calls)))
    (first, first_calls), (second, second_calls) = comparisons
    assert first.baseline == expected == second.baseline
    assert second.baseline is not first.baseline  # a copy each: no shared mutable figures
    # the first: its own figures and the baseline's; the second: its own only (the identity
    # calibration's figures are the raw model's, computed once)
    assert (first_calls, second_calls) == (2, 1)
    for comparison, model in zip((first, second), models, strict=True):
        judged = scored_rows(model, data, ["test"])
        assert comparison.model == comparison.model_uncalibrated
        assert comparison.model == quality_metrics(judged.labels, sigmoid(judged.logits))


def test_a_fitted_calibration_is_judged_apart_from_the_raw_model(snapshot):
    data, normalizer = snapshot
    model = _fitted("logistic", data, normalizer)
    held_out = scored_rows(model, data, ["val"])
    platt = fit_calibration(held_out.logits, held_out.labels, "platt")
    judged = scored_rows(model, data, ["test"])
    baseline = quality_metrics(judged.labels, np.full(len(judged.labels), 0.3))
    comparison = backtest_module.compare_on(judged, platt, held_out, baseline)
    assert comparison.model == quality_metrics(judged.labels, platt.probabilities(judged.logits))
    assert comparison.model_uncalibrated == quality_metrics(judged.labels, sigmoid(judged.logits))
    assert comparison.model != comparison.model_uncalibrated
    assert comparison.calibration_methods["platt"].logloss == comparison.model.logloss
    assert comparison.baseline is baseline


def _numpy_scalar_pav(z: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The isotonic map's pool-adjacent-violators loop as it was written on numpy scalars."""
    values, inverse = np.unique(z, return_inverse=True)
    weight = np.bincount(inverse).astype(np.float64)
    positives = np.bincount(inverse, weights=y)
    blocks: list[list[float]] = []
    for w, pos, zs in zip(weight, positives, values * weight, strict=True):
        blocks.append([w, pos, zs])
        while len(blocks) > 1 and blocks[-2][1] * blocks[-1][0] >= blocks[-1][1] * blocks[-2][0]:
            w2, p2, z2 = blocks.pop()
            blocks[-1][0] += w2
            blocks[-1][1] += p2
            blocks[-1][2] += z2
    arr = np.asarray(blocks)
    knots_p = (arr[:, 1] + y.mean()) / (arr[:, 0] + 1.0)
    return arr[:, 2] / arr[:, 0], np.maximum.accumulate(knots_p)


@pytest.mark.parametrize("decimals", [None, 1, 3])
def test_the_isotonic_map_has_the_blocks_and_knots_of_the_numpy_scalar_loop(decimals):
    rng = np.random.default_rng(8)
    z = rng.normal(0.0, 2.0, 20_000)
    z = z if decimals is None else np.round(z, decimals)  # ties: values of several rows
    y = (rng.random(len(z)) < 1.0 / (1.0 + np.exp(-z))).astype(np.float64)
    fitted = fit_calibration(z, y, "isotonic")
    knots_z, knots_p = _numpy_scalar_pav(z, y)
    assert np.asarray(fitted.knots_logit).tobytes() == knots_z.tobytes()
    assert np.asarray(fitted.knots_probability).tobytes() == knots_p.tobytes()
