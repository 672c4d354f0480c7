"""The whole job as one plain Python process: DuckDB prepares the data, torch trains the same
model for a given number of epochs and scores every customer, and trains the out-of-time
backtest's network (T-2H) the same way: the baseline ``bench_run`` compares ``hybridflow run``
with.

``python -m bench.duckdb_torch_baseline --events PATH --out DIR --epochs N`` prints one JSON
line: seconds per part, test ROC AUC, rows scored.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def _arrays(folder: Path, features: list[str]) -> tuple[np.ndarray, np.ndarray]:
    table = pq.read_table(folder)
    x = np.column_stack([table.column(f).to_numpy().astype(np.float32) for f in features])
    return x, table.column("label").to_numpy().astype(np.float32)


def train(snapshot: Path, normalizer: list[float], epochs: int, seed: int = 7):
    """The project's MLP (default hyper-parameters) trained on the ``split=train`` rows of a
    snapshot DuckDB wrote."""
    import torch

    from infra.settings import TrainingSettings
    from tasks.definitions.contract import CONTRACT_COLUMNS
    from tasks.definitions.feature_specs import feature_names
    from tasks.ml.models.mlp import CustomerMLP, MLPModel, MLPSpec, ModelConfig

    settings = TrainingSettings()
    spec = MLPSpec()
    torch.set_num_threads(1)  # as the train stage does for a small model on the CPU
    features = feature_names(set(CONTRACT_COLUMNS))
    means, stds = normalizer[0::2], [s if s and s > 1e-9 else 1.0 for s in normalizer[1::2]]
    torch.manual_seed(seed)
    model = CustomerMLP(
        ModelConfig(
            features=features,
            hidden_sizes=spec.hidden_sizes,
            dropout=spec.dropout,
            norm_mean=[float(m or 0.0) for m in means],
            norm_std=[float(s) for s in stds],
        )
    )
    x, y = _arrays(snapshot / "split=train", features)
    optimiser = torch.optim.AdamW(
        model.parameters(), lr=settings.learning_rate, weight_decay=settings.weight_decay
    )
    loss_fn = torch.nn.BCEWithLogitsLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(epochs):
        model.train()
        order = torch.randperm(len(xt))
        for start in range(0, len(xt), settings.batch_size):
            idx = order[start : start + settings.batch_size]
            optimiser.zero_grad()
            loss_fn(model(xt[idx]), yt[idx]).backward()
            optimiser.step()
    return MLPModel(model.eval())


def train_and_score(out: Path, prepared: dict, epochs: int) -> dict:
    """Train on the snapshot, judge on its test split, score the scoring features and write the
    predictions; and the out-of-time backtest: a network trained on the backtest snapshot (T-2H)
    judged on the run's training examples (T-H), as the train stage does."""
    from tasks.ml.metrics import roc_auc
    from tasks.ml.models import predict_proba

    model = train(out / "snapshot", prepared["normalizer"], epochs)
    features = model.features
    x_test, y_test = _arrays(out / "snapshot" / "split=test", features)
    auc = roc_auc(y_test, predict_proba(model, x_test))
    scoring = pq.read_table(out / "scoring.parquet")
    xs = np.column_stack([scoring.column(f).to_numpy().astype(np.float32) for f in features])
    scores = predict_proba(model, xs)
    pq.write_table(
        pa.table({"customer_id": scoring.column("customer_id"), "score": scores}),
        out / "predictions.parquet",
    )
    earlier = train(out / "backtest_snapshot", prepared["backtest_normalizer"], epochs)
    x_all, y_all = _arrays(out / "snapshot", features)
    backtest_auc = roc_auc(y_all, predict_proba(earlier, x_all))
    return {"test_auc": auc, "backtest_auc": backtest_auc, "rows_scored": len(scores)}


def main() -> None:
    """Prepare with DuckDB, train and score with torch; print the figures as JSON."""
    import duckdb

    from bench.duckdb_baseline import prepare

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--horizon-days", type=int, default=90)
    args = parser.parse_args()
    started = time.perf_counter()
    events, out = Path(args.events), Path(args.out)
    glob = str(events / "**" / "*.parquet") if events.is_dir() else str(events)
    prepared = prepare(duckdb.connect(), glob, args.horizon_days, out)
    prepare_s = time.perf_counter() - started
    result = train_and_score(out, prepared, args.epochs)
    print(
        json.dumps(
            {
                "seconds": time.perf_counter() - started,
                "prepare_s": prepare_s,
                "train_score_s": time.perf_counter() - started - prepare_s,
                "events": prepared["events"],
                **result,
            }
        )
    )


if __name__ == "__main__":
    main()
