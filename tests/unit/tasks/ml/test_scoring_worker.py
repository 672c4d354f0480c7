"""The per-worker model cache and the Arrow conversion of batch scoring (no Spark needed)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest
import torch

from infra.errors import ChecksumMismatchError
from infra.storage.store import sha256_bytes
from tasks.ml.models.mlp import CustomerMLP, MLPModel, ModelConfig
from tasks.ml.scoring_worker import (
    ScoringModel,
    _WorkerModelCache,
    feature_matrix,
    prediction_batch,
    torch_threads_per_task,
)

FEATURES = ["a", "b"]


def _model(seed: int) -> ScoringModel:
    torch.manual_seed(seed)
    net = CustomerMLP(
        ModelConfig(
            features=FEATURES, hidden_sizes=[4], dropout=0.0, norm_mean=[0, 0], norm_std=[1, 1]
        )
    )
    files = MLPModel(net).bundle_files()
    return ScoringModel(
        version=f"v{seed}",
        files=files,
        sha256={k: sha256_bytes(v) for k, v in files.items()},
        features=FEATURES,
    )


def test_cache_loads_each_bundle_once_and_keeps_a_bounded_number():
    cache = _WorkerModelCache(capacity=2)
    first, fresh = cache.get(_model(1))
    again, fresh_again = cache.get(_model(1))
    assert fresh and not fresh_again and again is first
    cache.get(_model(2))
    cache.get(_model(3))  # evicts model 1
    assert cache.loads == 3
    _, reloaded = cache.get(_model(1))
    assert reloaded and cache.loads == 4


def test_cache_refuses_bytes_that_do_not_match_their_sha256_and_stays_clean():
    cache = _WorkerModelCache()
    good = _model(1)
    weights = bytearray(good.files["model.pt"])
    weights[len(weights) // 2] ^= 0xFF
    tampered = ScoringModel(
        version=good.version,
        files={**good.files, "model.pt": bytes(weights)},
        sha256=good.sha256,
        features=FEATURES,
    )
    with pytest.raises(ChecksumMismatchError, match="model.pt"):
        cache.get(tampered)
    assert cache.loads == 0
    _, fresh = cache.get(good)
    assert fresh


def test_feature_matrix_orders_columns_and_zeroes_nulls_and_nans():
    batch = pa.RecordBatch.from_pydict(
        {"customer_id": ["x", "y"], "b": [1.0, None], "a": [float("nan"), 2.5]}
    )
    x = feature_matrix(batch, FEATURES)
    assert x.dtype == np.float32 and x.flags.c_contiguous
    np.testing.assert_array_equal(x, np.array([[0.0, 1.0], [2.5, 0.0]], dtype=np.float32))


def test_prediction_batch_follows_the_contract():
    out = prediction_batch(pa.array(["x", "y"]), np.array([0.25, 0.75]), "v1", dt.date(2025, 1, 2))
    assert out.schema.types == [pa.string(), pa.float64(), pa.string(), pa.date32()]
    assert out.column("model_version").to_pylist() == ["v1", "v1"]
    assert out.column("as_of").to_pylist() == [dt.date(2025, 1, 2)] * 2


@pytest.mark.parametrize(("value", "threads"), [(None, 1), ("1", 1), ("4", 4), ("x", 1), ("0", 1)])
def test_torch_threads_follow_spark_task_cpus(value, threads):
    assert torch_threads_per_task(value) == threads
