"""Training stage overhead and checkpoint throughput, each against a baseline in the same run.

1. ``train_loop_*``: samples/s of the train stage's loop (streamed Parquet, checkpoints every
   250 steps, logging, per-epoch validation) vs a bare PyTorch loop (data preloaded as tensors,
   the same model, epochs and per-epoch validation, no checkpoints), with the store a local folder
   and the moto_server S3 (on this same machine, so its CPU use competes with training: a
   pessimistic number for a remote S3). ``train_stage_*`` does the same for the whole stage wall
   time (adds content fingerprint, test evaluation, registration, gate).
2. ``checkpoint_save``: MB/s of :meth:`CheckpointStore.save` of a ~64 MB training state to a
   ``moto_server`` S3 on 127.0.0.1 (multipart) vs to a local folder store.

Run: ``python -m bench training``. CPU only here; see ``bench/gpu_check.py`` for the GPU.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

BUCKET = "hf-bench"
ROWS = 200_000
EPOCHS = 5
BATCH = 512
CKPT_EVERY = 250


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _MotoServer:
    """``moto_server`` in its own process (so the S3 server does not share our GIL)."""

    def __enter__(self) -> str:
        port = _free_port()
        exe = Path(sys.executable).with_name("moto_server")
        self.proc = subprocess.Popen(
            [str(exe), "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.endpoint = f"http://127.0.0.1:{port}"
        self.saved = {k: os.environ.get(k) for k in _ENV}
        os.environ.update(_ENV | {"AWS_ENDPOINT_URL": self.endpoint})
        import boto3

        deadline = time.monotonic() + 30
        while True:
            try:
                boto3.client("s3").create_bucket(Bucket=BUCKET)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        return self.endpoint

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_ENV = {
    "AWS_ENDPOINT_URL": "",
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _bare_loop(model: nn.Module, data, settings) -> tuple[float, int]:
    """The hand-written baseline: preloaded tensors, randperm, gather, step; val per epoch."""
    from tasks.ml.training_loop import network_logits

    xs, ys = zip(*data.chunks("train"), strict=True)
    x, y = torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))
    vx, _ = zip(*data.chunks("val"), strict=True)
    val_x = np.concatenate(vx)
    opt = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate)
    loss_fn = nn.BCEWithLogitsLoss()
    gen = torch.Generator().manual_seed(0)
    samples, started = 0, time.perf_counter()
    for _ in range(EPOCHS):
        model.train()
        order = torch.randperm(len(y), generator=gen)
        for i in range(0, len(order), BATCH):
            idx = order[i : i + BATCH]
            loss = loss_fn(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            samples += len(idx)
        model.eval()
        network_logits(model, val_x)
    return time.perf_counter() - started, samples


def _fresh_mlp(normalizer, settings) -> nn.Module:
    """The network the train stage would start from (default spec, seeded)."""
    from tasks.ml.models import FitJob
    from tasks.ml.models.mlp import MLPFamily, MLPSpec

    job = FitJob(data=None, normalizer=normalizer, settings=settings)  # type: ignore[arg-type]
    return MLPFamily().build(MLPSpec(), job)


def _training_rows(store, where: str) -> list[dict]:
    """Stage vs bare loop with the stage's store (and its checkpoints) at ``where``."""
    from infra.settings import HybridflowSettings
    from infra.storage.datasets import local_dataset_dir, read_dataset_manifest
    from infra.storage.registry import ModelRegistry
    from tasks.ml.normalizer import Normalizer
    from tasks.ml.snapshot_reader import SnapshotStream
    from tasks.stages.train import TrainingOptions, train_stage
    from tests.fixtures.synthetic_snapshot import publish_synthetic_snapshot

    torch.set_num_threads(1)
    torch.optim.AdamW([nn.Parameter(torch.zeros(1))])  # one-off lazy imports, outside the timing
    feats, prepared = publish_synthetic_snapshot(store, "bench", rows=ROWS, n_features=16)
    settings = HybridflowSettings(
        train={
            "batch_size": BATCH,
            "max_epochs": EPOCHS,
            "patience": EPOCHS,
            "threads": 1,
            "warm_start": False,
        },
        checkpoint={"every_steps": CKPT_EVERY, "every_seconds": 0},
    )
    manifest = read_dataset_manifest(store, prepared.snapshot_prefix)
    normalizer = Normalizer.model_validate(manifest.metadata["normalizer"])
    local = local_dataset_dir(store, manifest)
    try:  # the bare loop runs before and after the stage: load drift on a shared box cancels
        data = SnapshotStream(local, normalizer.features)
        bare_before = _bare_loop(_fresh_mlp(normalizer, settings.train), data, settings.train)
        started = time.perf_counter()
        output = train_stage(
            store,
            prepared,
            settings,
            as_of=feats.as_of,
            horizon_days=90,
            device_preference="cpu",
            options=TrainingOptions(fresh=True, families=["mlp"]),  # the loop, not gbm's
        )
        stage_s = time.perf_counter() - started
        bare_after = _bare_loop(_fresh_mlp(normalizer, settings.train), data, settings.train)
    finally:
        shutil.rmtree(local, ignore_errors=True)
    result = output.result
    loop_s = sum(h.seconds for h in output.history)
    samples = int(ModelRegistry(store).get(result.model_version).training["samples_seen"])
    bare_s = bare_before[0] + bare_after[0]
    bare_samples = bare_before[1] + bare_after[1]
    bare_rate = bare_samples / bare_s
    common = {"baseline": "bare PyTorch loop (preloaded tensors)", "unit": "samples/s"}
    return [
        {
            "benchmark": f"train_loop_{where}",
            "subject": f"train stage loop, checkpoints to {where} every {CKPT_EVERY} steps "
            f"({result.steps} steps)",
            "value": samples / loop_s,
            "baseline_value": bare_rate,
            "ratio": (samples / loop_s) / bare_rate,
            **common,
        },
        {
            "benchmark": f"train_stage_{where}",
            "subject": "whole train stage incl. fingerprint, test eval, register, gate",
            "value": samples / stage_s,
            "baseline_value": bare_rate,
            "ratio": (samples / stage_s) / bare_rate,
            **common,
        },
    ]


def _checkpoint_rows(work: Path) -> list[dict]:
    from infra.storage.store import LocalFolderStore, S3Store
    from tasks.ml.checkpoints import CheckpointStore

    state = {"weights": torch.randn(16 << 20), "step": 1}  # 64 MB
    size_mb = state["weights"].numel() * 4 / 1e6
    rates = {}
    for name, store in (
        ("s3", S3Store(f"s3://{BUCKET}/ckpt")),
        ("local", LocalFolderStore(work / "local-store")),
    ):
        ckpts = CheckpointStore(store, "t-bench", keep=1)
        times = []
        for step in range(1, 4):
            t0 = time.perf_counter()
            ckpts.save(state, step=step, epoch=1, batch=0, samples_seen=0)
            times.append(time.perf_counter() - t0)
        rates[name] = size_mb / float(np.median(times))
    return [
        {
            "benchmark": "checkpoint_save",
            "subject": f"{size_mb:.0f} MB checkpoint to moto_server S3 (multipart, HTTP)",
            "baseline": "same checkpoint to a local folder store",
            "unit": "MB/s",
            "value": rates["s3"],
            "baseline_value": rates["local"],
            "ratio": rates["s3"] / rates["local"],
        }
    ]


def main(results_dir: Path) -> list[dict]:
    """Both benchmarks against one moto_server."""
    work = Path(tempfile.mkdtemp(prefix="hf-bench-train-"))
    try:
        with _MotoServer():
            from infra.storage.store import LocalFolderStore, S3Store

            return (
                _training_rows(LocalFolderStore(work / "stage-store"), "folder")
                + _training_rows(S3Store(f"s3://{BUCKET}/training"), "moto_s3")
                + _checkpoint_rows(work)
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
