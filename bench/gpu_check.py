"""GPU check for the train stage: run once on a machine with a GPU and paste the output.

    python -m bench.gpu_check              # ~2-4 min on one GPU
    python -m bench.gpu_check --quick      # smaller sizes (what CI on a CPU box runs)

What it measures (one JSON line per check, plus a table):

1. ``matmul_mlp``: training throughput (samples/s) of a large MLP (4 x 4096 hidden, 512 inputs,
   batch 4096) in fp32 vs bf16 autocast (+TF32), and GPU utilisation sampled with ``nvidia-smi``
   while it runs.
2. ``train_stage``: the real train stage (streamed Parquet snapshot, bf16 autocast, pinned memory,
   torch.compile on CUDA, checkpoints to a folder store) on a 1M-row synthetic snapshot:
   samples/s and utilisation.
3. ``ddp``: the same stage under ``torchrun --nproc_per_node=<GPUs>`` when there is more than one
   GPU (skipped otherwise).

On a machine without CUDA it runs everything on CPU with small sizes, every row labelled
``device=cpu (NO GPU: not GPU numbers)``, so the script itself stays tested.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch import nn


class UtilisationSampler:
    """Average GPU utilisation (%) from ``nvidia-smi`` sampled every 0.5 s in a thread."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.available = shutil.which("nvidia-smi") is not None and torch.cuda.is_available()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            values = [float(v) for v in out.split() if v.strip().replace(".", "").isdigit()]
            if values:
                self.samples.append(sum(values) / len(values))

    def __enter__(self) -> UtilisationSampler:
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.available:
            self._thread.join(timeout=5)

    @property
    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None


def _label(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return "cpu (NO GPU: not GPU numbers)"


def matmul_mlp(device: torch.device, quick: bool) -> list[dict]:
    """fp32 vs bf16-autocast training throughput of a large MLP."""
    width, depth, batch, steps = (4096, 4, 4096, 60) if not quick else (256, 2, 256, 20)
    rows = []
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        layers: list[nn.Module] = [nn.Linear(512, width), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.ReLU()]
        model = nn.Sequential(*layers, nn.Linear(width, 1)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        torch.backends.cuda.matmul.allow_tf32 = precision == "bf16"
        x = torch.randn(batch, 512, device=device)
        y = torch.rand(batch, 1, device=device)
        use_bf16 = precision == "bf16"
        with UtilisationSampler() as util:
            for i in range(steps + 5):
                if i == 5:  # warm-up done
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                    loss = nn.functional.binary_cross_entropy_with_logits(model(x).float(), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
        params = sum(p.numel() for p in model.parameters())
        rows.append(
            {
                "check": "matmul_mlp",
                "device": _label(device),
                "precision": precision,
                "params_millions": round(params / 1e6, 1),
                "samples_per_s": round(steps * batch / seconds),
                "tflops_approx": round(6 * params * steps * batch / seconds / 1e12, 2),
                "gpu_util_pct": util.mean,
            }
        )
    rows[1]["speedup_vs_fp32"] = round(rows[1]["samples_per_s"] / rows[0]["samples_per_s"], 2)
    return rows


def _stage_env(store: Path, quick: bool) -> dict[str, str]:
    return {
        "HYBRIDFLOW_STORE": str(store),
        "HYBRIDFLOW_TRAIN__BATCH_SIZE": "4096" if not quick else "256",
        "HYBRIDFLOW_TRAIN__MAX_EPOCHS": "5" if not quick else "2",
        "HYBRIDFLOW_TRAIN__PATIENCE": "5",
        "HYBRIDFLOW_TRAIN__FAMILIES": "mlp",
        "HYBRIDFLOW_TRAIN__SPECS": '{"mlp": {"hidden_sizes": %s}}'
        % ("[1024, 1024, 512]" if not quick else "[64, 32]"),
        "HYBRIDFLOW_TRAIN__WARM_START": "false",
        "HYBRIDFLOW_CHECKPOINT__EVERY_STEPS": "200",
    }


def train_stage_check(device: torch.device, quick: bool, work: Path, processes: int) -> dict:
    """The real train stage (``python -m tasks.stages.train_process``, under torchrun when processes > 1)."""
    from infra.storage.store import LocalFolderStore
    from tasks.ml.ddp import ddp_command
    from tests.fixtures.synthetic_snapshot import publish_synthetic_snapshot

    store_dir = work / f"store-{processes}"
    rows = 1_000_000 if not quick else 20_000
    publish_synthetic_snapshot(LocalFolderStore(store_dir), "gpu", rows=rows, n_features=32)
    args = ["--run-id", "gpu", "--device", device.type, "--result-file", str(work / "r.json")]
    cmd = (
        ddp_command(processes, args)
        if processes > 1
        else [sys.executable, "-m", "tasks.stages.train_process", *args]
    )
    env = os.environ | _stage_env(store_dir, quick)
    with UtilisationSampler() as util:
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"check": "train_stage", "processes": processes, "error": proc.stderr[-2000:]}
    result = json.loads((work / "r.json").read_text())
    history = result["history"]
    loop_s = sum(h["seconds"] for h in history)
    n_train = result["result"]["n_train"]
    return {
        "check": "train_stage" if processes == 1 else "ddp",
        "device": _label(device),
        "processes": processes,
        "rows_train": n_train,
        "epochs": len(history),
        "samples_per_s_loop": round(n_train * len(history) / loop_s),
        "stage_wall_s": round(seconds, 1),
        "test_auc": round(result["result"]["metrics"]["auc"], 4),
        "gpu_util_pct": util.mean,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the checks and print JSON lines and a table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (implied without CUDA)")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    quick = args.quick or not cuda
    if not cuda:
        print("gpu_check: NO CUDA DEVICE: running the checks on CPU with small sizes", flush=True)
    work = Path(tempfile.mkdtemp(prefix="hf-gpu-check-"))
    rows: list[dict] = []
    try:
        rows += matmul_mlp(device, quick)
        rows.append(train_stage_check(device, quick, work, 1))
        gpus = torch.cuda.device_count() if cuda else 0
        if gpus > 1:
            rows.append(train_stage_check(device, quick, work, gpus))
        else:
            rows.append({"check": "ddp", "skipped": f"{gpus} GPU(s): DDP needs more than one"})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for row in rows:
        print(json.dumps(row))
    from bench.__main__ import print_table

    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
