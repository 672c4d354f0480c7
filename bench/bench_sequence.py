"""The sequence family's training throughput against a bare PyTorch loop on the same tensors.

Both train the same :class:`tasks.ml.models.sequence.SequenceNet` (fresh, seeded) for the same
epochs, batch size and optimiser on a snapshot with sequence columns
(``tests/fixtures/sequence_snapshot.py``, ``BENCH_SEQUENCE_ROWS`` customers, default 50,000, N =
``BENCH_SEQUENCE_LENGTH``, default 32), with a validation pass per epoch. The family goes through
the seam (``get_family("sequence").fit``: the streamed snapshot reader building each batch's
inputs from the list columns, the training loop, early-stopping bookkeeping); the baseline has
every input preloaded as one tensor. Run once per encoder (GRU and transformer); the bare loop
runs before and after the family, so load drift on a shared box cancels. ``ratio`` = family
samples/s over the bare loop's. CPU only here (1 torch thread); on CUDA the same code runs with
bf16 autocast and ``torch.compile``. Also one request's scoring latency (p99 of
``predict_proba`` on one customer's inputs, what the endpoint runs for this family) against the
MLP's fast path.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from torch import nn

EPOCHS = 3
BATCH = 1024


def _bare_loop(network: nn.Module, x: torch.Tensor, y: torch.Tensor, val_x: np.ndarray, settings):
    """Seconds and samples of the same epochs over preloaded tensors."""
    from tasks.ml.training_loop import network_logits

    opt = torch.optim.AdamW(
        network.parameters(), lr=settings.learning_rate, weight_decay=settings.weight_decay
    )
    loss_fn = nn.BCEWithLogitsLoss()
    gen = torch.Generator().manual_seed(0)
    started, samples = time.perf_counter(), 0
    for _ in range(EPOCHS):
        network.train()
        order = torch.randperm(len(y), generator=gen)
        for i in range(0, len(order), BATCH):
            idx = order[i : i + BATCH]
            loss = loss_fn(network(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            samples += len(idx)
        network.eval()
        network_logits(network, val_x)
    return time.perf_counter() - started, samples


def _rows_for(encoder: str, root: Path, length: int) -> list[dict]:
    from infra.settings import TrainingSettings
    from tasks.ml.model_inputs import input_matrix
    from tasks.ml.models import FitJob, family_specs, get_family, predict_proba
    from tasks.ml.normalizer import Normalizer
    from tasks.ml.snapshot_reader import SnapshotStream
    from tests.fixtures.sequence_snapshot import FEATURES

    settings = TrainingSettings(
        batch_size=BATCH, max_epochs=EPOCHS, patience=EPOCHS, threads=1, warm_start=False
    )
    (spec,) = family_specs(["sequence"], {"sequence": {"encoder": encoder}})
    family = get_family("sequence")
    data = SnapshotStream(root, FEATURES)
    job = FitJob(
        data=data,
        normalizer=Normalizer(features=FEATURES, mean=[2.0, 1.0], std=[1.0, 1.0]),
        settings=settings,
    )
    network = family.build(spec, job)  # type: ignore[attr-defined]
    view = data.with_features(network.config.inputs())
    train = pq.read_table(root / "split=train")
    x = torch.from_numpy(input_matrix(train, view.features))
    y = torch.from_numpy(train.column("label").to_numpy().astype(np.float32))
    val_x = input_matrix(pq.read_table(root / "split=val"), view.features)

    before = _bare_loop(family.build(spec, job), x, y, val_x, settings)  # type: ignore[attr-defined]
    started = time.perf_counter()
    outcome = family.fit(spec, job)
    fit_s = time.perf_counter() - started
    after = _bare_loop(family.build(spec, job), x, y, val_x, settings)  # type: ignore[attr-defined]
    samples = int(outcome.record["samples_seen"])
    bare_rate = (before[1] + after[1]) / (before[0] + after[0])
    rate = samples / fit_s
    latency = _latency_ms(lambda: predict_proba(outcome.model, val_x[:1]))
    fast = _mlp_fast_path(len(FEATURES))
    mlp_latency = _latency_ms(lambda: fast(val_x[:1, : len(FEATURES)]))
    throughput = {
        "benchmark": f"sequence_{encoder}",
        "subject": f"sequence family fit ({outcome.model.describe()}), {EPOCHS} epochs",
        "baseline": "bare PyTorch loop, same network, preloaded tensors",
        "ratio": rate / bare_rate,
        "unit": "samples/s",
        "value": rate,
        "baseline_value": bare_rate,
        "rows": len(y),
        "length": length,
        "parameters": outcome.model.n_parameters,
        "load": os.getloadavg()[0],
    }
    scoring = {
        "benchmark": f"sequence_{encoder}_request",
        "subject": "one customer scored as the endpoint does (predict_proba), p99",
        "baseline": "the MLP's fast path on the aggregate features, p99",
        "ratio": mlp_latency[1] / latency[1],
        "unit": "ms",
        "value": latency[1],
        "baseline_value": mlp_latency[1],
        "p50_ms": latency[0],
        "length": length,
    }
    return [throughput, scoring]


def _latency_ms(call, n: int = 300) -> tuple[float, float]:
    """p50 and p99 of ``call`` in milliseconds (after a warm-up)."""
    for _ in range(20):
        call()
    times = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return float(np.percentile(times, 50)), float(np.percentile(times, 99))


def _mlp_fast_path(n_features: int):
    from tasks.ml.models.mlp import CustomerMLP, ModelConfig, fast_scorer

    config = ModelConfig(
        features=[f"f{i}" for i in range(n_features)],
        hidden_sizes=[64, 32],
        dropout=0.0,
        norm_mean=[0.0] * n_features,
        norm_std=[1.0] * n_features,
    )
    scorer = fast_scorer(CustomerMLP(config).eval())
    assert scorer is not None
    return scorer


def main(results_dir: Path) -> list[dict]:
    """Both encoders against the bare loop."""
    from tests.fixtures.sequence_snapshot import write_sequence_snapshot

    torch.set_num_threads(1)
    torch.optim.AdamW([nn.Parameter(torch.zeros(1))])  # one-off lazy imports, outside the timing
    rows = int(os.environ.get("BENCH_SEQUENCE_ROWS", "50000"))
    length = int(os.environ.get("BENCH_SEQUENCE_LENGTH", "32"))
    work = Path(tempfile.mkdtemp(prefix="hf-bench-sequence-"))
    try:
        root = write_sequence_snapshot(work / "snapshot", rows, length)
        return [
            row for encoder in ("gru", "transformer") for row in _rows_for(encoder, root, length)
        ]
    finally:
        shutil.rmtree(work, ignore_errors=True)
