"""A training snapshot with a planted signal, published straight to the store (no Spark).

Benchmarks and tests of the train stage use it to get a realistic snapshot in milliseconds: the
same layout, normaliser metadata and stage manifests as :mod:`tasks.preprocess` publishes, with
labels drawn from a known logistic model of the (log-scaled) features, so a good model reaches a
known AUC and a model that ignores the features scores 0.5.
"""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from infra.datasets import publish_dataset
from infra.store import ObjectStore, sha256_bytes
from tasks.preprocess import Normalizer
from tasks.stage_records import (
    FeaturesResult,
    PreprocessResult,
    StageReport,
    write_stage_manifest,
)

AS_OF = dt.date(2025, 12, 31)
SPLIT_SHARES = {"train": 0.7, "val": 0.15, "test": 0.15}


def planted_weights(n_features: int) -> np.ndarray:
    """The true coefficients: fixed, so every snapshot of a given width shares the signal."""
    return np.random.default_rng(1234).normal(0.0, 1.2, n_features)


def publish_synthetic_snapshot(
    store: ObjectStore,
    run_id: str,
    *,
    rows: int = 5000,
    n_features: int = 8,
    seed: int = 0,
    files_per_split: int = 2,
) -> tuple[FeaturesResult, PreprocessResult]:
    """Publish a snapshot and the ``features``/``preprocess`` manifests of run ``run_id``."""
    rng = np.random.default_rng(seed)
    features = [f"f{i:02d}" for i in range(n_features)]
    raw = rng.lognormal(mean=1.0, sigma=1.0, size=(rows, n_features)) - 1.0
    z = np.sign(raw) * np.log1p(np.abs(raw))
    z = (z - z.mean(0)) / z.std(0)
    logits = z @ planted_weights(n_features) - 1.0
    labels = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logits))).astype(np.int32)
    ids = np.array([f"c{seed}-{i:07d}" for i in range(rows)])
    splits = rng.choice(list(SPLIT_SHARES), size=rows, p=list(SPLIT_SHARES.values()))
    staging = store.staging_dir()
    counts = {}
    for split in SPLIT_SHARES:
        idx = np.flatnonzero(splits == split)
        counts[split] = len(idx)
        folder = staging / f"split={split}"
        folder.mkdir(parents=True)
        for part, chunk in enumerate(np.array_split(idx, files_per_split)):
            table = pa.table(
                {
                    "customer_id": ids[chunk],
                    "label": labels[chunk],
                    **{f: raw[chunk, i] for i, f in enumerate(features)},
                }
            )
            pq.write_table(table, folder / f"part-{part:05d}.parquet")
    train_z = np.sign(raw[splits == "train"]) * np.log1p(np.abs(raw[splits == "train"]))
    normalizer = Normalizer(
        features=features,
        mean=[float(v) for v in train_z.mean(0)],
        std=[float(v) for v in train_z.std(0)],
    )
    prefix = f"snapshots/synthetic-{run_id}"
    snapshot = publish_dataset(
        store,
        staging,
        prefix,
        rows=rows,
        metadata={"normalizer": normalizer.model_dump(), "features": features},
    )
    fingerprint = sha256_bytes(json.dumps({"files": snapshot.files, "counts": counts}).encode())
    feats = FeaturesResult(
        report=StageReport(name="features", seconds=0.0),
        as_of=AS_OF,
        horizon_days=90,
        features=features,
        training_prefix=prefix,
        scoring_prefix=prefix,
        n_training=rows,
        n_scoring=rows,
        positive_rate=float(labels.mean()),
        events_after_as_of=0,
    )
    prepared = PreprocessResult(
        report=StageReport(name="preprocess", seconds=0.0),
        snapshot_prefix=prefix,
        split_counts=counts,
        features=features,
        data_fingerprint=fingerprint,
    )
    write_stage_manifest(store, run_id, "features", feats)
    write_stage_manifest(store, run_id, "preprocess", prepared)
    return feats, prepared
