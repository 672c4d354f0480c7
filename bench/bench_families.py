"""Training throughput of each model family through the seam against the same fit done by hand
on the same rows: ``rfm`` against the gate's own baseline fit (:func:`fit_baseline`, numpy
Newton on the same four columns), ``logistic`` against the plain numpy Newton solver
(:func:`fit_logistic`, one penalty) , ``gbm`` against ``lightgbm.train`` with the same parameters, ``mlp`` against a
bare torch loop (preloaded tensors, same epochs and batch size). Ratio = family / baseline; the
family's extra work (the logistic penalty grid, reading the snapshot, early stopping) is what the
ratio shows.

Rows: ``BENCH_FAMILY_ROWS`` (default 100,000) of a synthetic snapshot with 16 features.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


def _timed(fn) -> tuple[float, object]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def main(results_dir: Path) -> list[dict]:
    """One row per family: seconds through the seam, seconds of the hand-written fit."""
    import lightgbm as lgb
    import torch
    from torch import nn

    from infra.settings import TrainingSettings
    from infra.storage.datasets import local_dataset_dir, read_dataset_manifest
    from infra.storage.store import LocalFolderStore
    from tasks.ml.baseline import baseline_columns, fit_baseline
    from tasks.ml.logistic import fit_logistic
    from tasks.ml.models import FitJob, get_family, split_arrays
    from tasks.ml.normalizer import Normalizer
    from tasks.ml.snapshot_reader import SnapshotStream
    from tests.fixtures.synthetic_snapshot import publish_synthetic_snapshot

    rows = int(os.environ.get("BENCH_FAMILY_ROWS", "100000"))
    work = Path(tempfile.mkdtemp(prefix="hf-bench-families-"))
    torch.set_num_threads(1)
    out = []
    try:
        store = LocalFolderStore(work / "store")
        _, prepared = publish_synthetic_snapshot(store, "bench", rows=rows, n_features=16)
        manifest = read_dataset_manifest(store, prepared.snapshot_prefix)
        norm = Normalizer.model_validate(manifest.metadata["normalizer"])
        data = SnapshotStream(local_dataset_dir(store, manifest), norm.features)
        x, y = split_arrays(data, "train")
        vx, vy = split_arrays(data, "val")
        settings = TrainingSettings(threads=1, max_epochs=5, patience=5, batch_size=1024)

        def family_fit(kind: str):
            family = get_family(kind)
            job = FitJob(data=data, normalizer=norm, settings=settings)
            return family.fit(family.spec(), job)

        def by_hand_rfm():
            return fit_baseline(x[:, baseline_columns(norm.features)], y)

        def by_hand_logistic():
            return fit_logistic(norm.transform(x), y, l2=1e-4)

        def by_hand_gbm():
            params = {
                "objective": "binary",
                "learning_rate": 0.05,
                "num_leaves": 31,
                "min_data_in_leaf": 50,
                "feature_fraction": 0.9,
                "lambda_l2": 1.0,
                "seed": 7,
                "deterministic": True,
                "force_row_wise": True,
                "num_threads": 1,
                "verbosity": -1,
            }
            train = lgb.Dataset(x, label=y)
            valid = lgb.Dataset(vx, label=vy, reference=train)
            return lgb.train(
                params,
                train,
                1000,
                valid_sets=[valid],
                callbacks=[lgb.early_stopping(30, verbose=False)],
            )

        def by_hand_mlp():
            torch.manual_seed(7)
            net = nn.Sequential(
                nn.Linear(x.shape[1], 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1)
            )
            xt = torch.from_numpy(norm.transform(x).astype(np.float32))
            yt = torch.from_numpy(y)
            opt = torch.optim.AdamW(net.parameters(), lr=settings.learning_rate)
            loss_fn = nn.BCEWithLogitsLoss()
            for _ in range(settings.max_epochs):
                order = torch.randperm(len(yt))
                for i in range(0, len(order), settings.batch_size):
                    idx = order[i : i + settings.batch_size]
                    loss = loss_fn(net(xt[idx]).squeeze(-1), yt[idx])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
            return net

        family_fit("gbm")  # one-off imports outside the timing
        baselines = {
            "rfm": ("the gate's baseline fit (numpy Newton, same 4 columns)", by_hand_rfm),
            "logistic": ("numpy Newton, one penalty", by_hand_logistic),
            "gbm": ("lightgbm.train, same parameters", by_hand_gbm),
            "mlp": ("bare torch loop, same epochs", by_hand_mlp),
        }
        for kind, (name, baseline) in baselines.items():
            seconds, outcome = _timed(lambda kind=kind: family_fit(kind))
            base_seconds, _ = _timed(baseline)
            out.append(
                {
                    "benchmark": "family fit",
                    "subject": f"{kind} through the seam ({len(y):,} train rows)",
                    "baseline": name,
                    "ratio": seconds / base_seconds,
                    "seconds": seconds,
                    "baseline_s": base_seconds,
                    "rows_per_s": len(y) / seconds,
                    "parameters": outcome.model.n_parameters,
                }
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out
