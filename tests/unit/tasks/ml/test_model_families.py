"""Every built-in family: fitted on a small snapshot, registered, loaded back through the
registry, scored identically by predict_proba, by batch scoring and by the endpoint's path;
no bundle file is a pickle; and the champion's choice (log loss, then AUC, then size, then name)."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from infra.settings import TrainingSettings
from infra.storage.registry import ModelRegistry
from infra.storage.store import LocalFolderStore
from serving.holder import _checked_fast_scorer
from tasks.ml.baseline import BASELINE_FAMILY, baseline_columns, fit_baseline
from tasks.ml.champion import LeaderboardRow, champion_line, crown
from tasks.ml.metrics import roc_auc
from tasks.ml.models import (
    CONFIG_FILE,
    FitJob,
    get_family,
    list_families,
    load_model,
    predict_proba,
    split_arrays,
)
from tasks.ml.scoring_worker import ScoringModel, ScoringUnit, score_unit
from tests.fixtures.synthetic_snapshot import publish_synthetic_snapshot, synthetic_stream

FAMILIES = ("rfm", "logistic", "gbm", "mlp")
MIN_AUC = {"rfm": 0.62}  # four of the eight planted features; the others see all eight


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    torch.set_num_threads(1)
    store = LocalFolderStore(tmp_path_factory.mktemp("families") / "store")
    _, prepared = publish_synthetic_snapshot(store, "fam", rows=4000, seed=8)
    data, normalizer = synthetic_stream(store, prepared)
    return store, data, normalizer


def test_the_builtin_families_are_registered():
    assert set(FAMILIES) <= set(list_families())


def test_the_default_contenders_include_the_baseline_recipe():
    assert TrainingSettings().families == ["rfm", "logistic", "gbm", "mlp"]


def test_the_rfm_family_is_the_baseline_fitted_as_a_servable_model(snapshot):
    """Same features, transform and penalty as the gate's baseline: the same probabilities
    (uncalibrated) on any rows, from four coefficients, while it reads every snapshot feature."""
    _, data, normalizer = snapshot
    settings = TrainingSettings(threads=1)
    family = get_family(BASELINE_FAMILY)
    model = family.fit(family.spec(), FitJob(data=data, normalizer=normalizer, settings=settings))
    assert model.model.features == normalizer.features and model.model.n_parameters == 5
    train_x, train_y = split_arrays(data, "train")
    columns = baseline_columns(normalizer.features)
    baseline = fit_baseline(train_x[:, columns], train_y)
    x, _ = split_arrays(data, "test")
    np.testing.assert_allclose(
        predict_proba(model.model, x, calibrated=False),
        baseline.predict_proba(x[:, columns]),
        rtol=0,
        atol=1e-6,
    )
    # the other features do not move its score
    shuffled = x.copy()
    others = [i for i in range(x.shape[1]) if i not in columns]
    shuffled[:, others] = shuffled[::-1, others]
    np.testing.assert_array_equal(
        predict_proba(model.model, shuffled), predict_proba(model.model, x)
    )
    hints = family.cost_hints(family.spec(), len(normalizer.features), settings)
    logistic = get_family("logistic")
    assert not hints.network and hints.parameters == 5
    assert (
        hints.train_flops_per_row
        < logistic.cost_hints(
            logistic.spec(), len(normalizer.features), settings
        ).train_flops_per_row
    )


@pytest.mark.parametrize("kind", FAMILIES)
def test_a_family_round_trips_and_scores_the_same_everywhere(kind, snapshot):
    store, data, normalizer = snapshot
    family = get_family(kind)
    settings = TrainingSettings(max_epochs=4, batch_size=256, threads=1)
    outcome = family.fit(family.spec(), FitJob(data=data, normalizer=normalizer, settings=settings))
    model = outcome.model
    assert model.kind == kind and model.features == normalizer.features and model.n_parameters > 0
    x, y = split_arrays(data, "test")
    assert roc_auc(y, predict_proba(model, x)) > MIN_AUC.get(kind, 0.75)  # the planted signal

    files = model.bundle_files()
    assert json.loads(files[CONFIG_FILE])["kind"] == kind
    for body in files.values():
        assert not body.startswith(b"\x80")  # no raw pickle stream (torch's zip is checked below)
    registry = ModelRegistry(store)
    manifest = registry.register(files, kind=kind, features=model.features)
    assert manifest.kind == kind
    _, stored = registry.read_files(manifest.version)
    loaded = load_model(stored, manifest.files)
    assert loaded.kind == kind and type(loaded) is type(model)
    expected = predict_proba(model, x)
    np.testing.assert_array_equal(predict_proba(loaded, x), expected)

    # batch scoring: a features file in the store scored by the scoring worker
    table = pa.table(
        {"customer_id": [f"c{i}" for i in range(len(x))]}
        | {f: x[:, j].astype(np.float64) for j, f in enumerate(model.features)}
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    store.put_bytes(f"scratch/{kind}/features.parquet", sink.getvalue().to_pybytes())
    unit = ScoringUnit(f"scratch/{kind}/features.parquet", f"scratch/{kind}/predictions.parquet")
    scoring = ScoringModel(manifest.version, stored, dict(manifest.files), model.features)
    assert score_unit(store, unit, scoring, loaded, dt.date(2025, 12, 31)) == len(x)
    scores = pq.read_table(pa.BufferReader(store.get_bytes(unit.target_key))).column("score")
    np.testing.assert_allclose(scores.to_numpy(), expected, rtol=0, atol=1e-12)

    # the endpoint: the scorer the holder serves (the family's fast path when it matches)
    served = _checked_fast_scorer(loaded, x[:256], expected[:256], manifest.version)
    np.testing.assert_allclose(served(x[:256]), expected[:256], rtol=0, atol=1e-6)
    np.testing.assert_allclose(served(x[:1]), expected[:1], rtol=0, atol=1e-6)


def _row(family: str, logloss: float, auc: float, size: int = 10) -> LeaderboardRow:
    return LeaderboardRow(
        family=family,
        version=f"m-{family}",
        size=size,
        auc=auc,
        logloss=logloss,
        ece=0.01,
        mean_score=0.2,
        positive_rate=0.2,
        test_auc=auc,
        test_logloss=logloss,
        train_seconds=1.0,
        seconds=2.0,
    )


def test_the_lowest_log_loss_wins_and_auc_breaks_ties():
    board = crown([_row("mlp", 0.30, 0.95), _row("gbm", 0.28, 0.90), _row("logistic", 0.31, 0.99)])
    assert [r.family for r in board] == ["gbm", "mlp", "logistic"]
    assert board[0].champion and not any(r.champion for r in board[1:])
    assert "gbm won on backtest (lowest log loss" in champion_line(board)
    tie = crown([_row("mlp", 0.2800001, 0.91), _row("gbm", 0.28, 0.90)])
    assert tie[0].family == "mlp" and "tied on log loss, higher AUC" in champion_line(tie)


def test_a_full_tie_goes_to_the_smaller_model_then_the_name_whatever_the_order():
    rows = [
        _row("mlp", 0.28, 0.9, size=500),
        _row("gbm", 0.28, 0.9, size=50),
        _row("a", 0.28, 0.9, 50),
    ]
    for order in (rows, rows[::-1], rows[1:] + rows[:1]):
        assert [r.family for r in crown(order)] == ["a", "gbm", "mlp"]
    with pytest.raises(ValueError):
        crown([])
