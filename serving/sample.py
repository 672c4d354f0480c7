"""A small registry and feature snapshot built without Spark, for trying the endpoint, its
tests and its benchmark: random customers with realistic feature names and untrained (seeded)
models registered as real, verifiable versions."""

from __future__ import annotations

import datetime as dt
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from infra.datasets import publish_dataset
from infra.registry import ModelRegistry
from infra.store import ObjectStore
from tasks.build_features import scoring_features_prefix
from tasks.events_contract import CONTRACT_COLUMNS
from tasks.features import feature_names
from tasks.model import CustomerMLP, ModelConfig, bundle_bytes

SAMPLE_FEATURES = feature_names(set(CONTRACT_COLUMNS))  # input with every optional column


def sample_feature_table(customers: int, seed: int = 0) -> pa.Table:
    """``customer_id`` (``c000000``...) plus every feature, heavy-tailed non-negative values."""
    rng = np.random.default_rng(seed)
    columns: dict[str, object] = {"customer_id": [f"c{i:06d}" for i in range(customers)]}
    for name in SAMPLE_FEATURES:
        columns[name] = rng.exponential(rng.uniform(0.5, 50.0), size=customers)
    return pa.table(columns)


def publish_sample_snapshot(store: ObjectStore, table: pa.Table, as_of: dt.date) -> str:
    """Publish ``table`` as the scoring features for ``as_of``; returns the dataset prefix."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "data"
        folder.mkdir()
        pq.write_table(table, folder / "part-00000.parquet")
        manifest = publish_dataset(
            store, folder, scoring_features_prefix(as_of), rows=table.num_rows
        )
    return manifest.prefix


def sample_model(table: pa.Table, seed: int, hidden_sizes: list[int] | None = None) -> CustomerMLP:
    """An untrained MLP whose normaliser is fitted on ``table`` (seeded weights)."""
    x = np.column_stack([table.column(f).to_numpy() for f in SAMPLE_FEATURES])
    logged = np.sign(x) * np.log1p(np.abs(x))
    torch.manual_seed(seed)
    return CustomerMLP(
        ModelConfig(
            features=list(SAMPLE_FEATURES),
            hidden_sizes=hidden_sizes or [64, 32],
            dropout=0.0,
            norm_mean=logged.mean(axis=0).tolist(),
            norm_std=np.maximum(logged.std(axis=0), 1e-6).tolist(),
        )
    ).eval()


def register_sample_model(
    store: ObjectStore,
    table: pa.Table,
    seed: int,
    *,
    promote: bool = True,
    nan_weights: bool = False,
) -> str:
    """Register a sample model (optionally with NaN weights) and point production at it."""
    model = sample_model(table, seed)
    if nan_weights:
        with torch.no_grad():
            model.net[0].weight.fill_(float("nan"))
    registry = ModelRegistry(store)
    manifest = registry.register(
        bundle_bytes(model),
        features=list(SAMPLE_FEATURES),
        code_version="serving-sample",
        horizon_days=90,
        metrics={"test_auc": 0.5},
    )
    if promote:
        registry.set_alias(manifest.version, f"sample model seed {seed}")
    return manifest.version
