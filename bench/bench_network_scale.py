"""Fitting at scale: what each contender's fit costs at ``BENCH_SCALE_ROWS`` examples (default
2,000,000, 46 features: the training examples of 2M customers), each against a baseline in the
same run.

1. ``scale_mlp_loop``: the mlp family's fit through the seam with the plan the example count
   and the cores call for (``tasks.ml.network_plan``: scaled batch and learning rate, threads)
   against a bare PyTorch loop on the same tensors preloaded in memory, the same batch, threads,
   epochs (``BENCH_SCALE_LOOP_EPOCHS``, default 4, early stopping off) and per-epoch validation
   (what "data loading never starves the loop" is measured by): with a global shuffle, and in
   the reader's order (blocks of ``chunk_rows`` rows, permuted within: the strongest baseline).
   Best of ``BENCH_SCALE_ROUNDS`` (2) alternating rounds; the snapshot's first read (Parquet
   decoded into the reader's cache, what the bare loops' preload is) is timed apart
   (``first_read_s``), before them.
2. ``scale_mlp_plan``: the same fit with the plan against the fit as it was (batch 1,024, one
   thread): wall seconds and validation log loss of each.
3. ``scale_family_<kind>``: the logistic and gbm fits (their thread rule) on the same rows.
4. ``scale_backtest_<family>``: the backtest's refit at T-2H (a second snapshot, another
   seed) as the train stage runs it (``tasks.ml.backtest.backtest_fit_job``: a label-free sample
   of ``HYBRIDFLOW_TRAIN__BACKTEST_MAX_ROWS`` training rows; a network planned for the unsampled
   rows, its epochs bounded by the production fit's fewest examples) against the family's
   production fit on the first snapshot (the goal: ratio <= 1); for the mlp also the sample fit
   with its own plan and no bound (``scale_backtest_mlp_own_plan``: the code before). The judged
   log loss (the backtest model on the first snapshot's test split) is in the subject.
5. ``scale_refit_<family>`` (part ``refit``): the full refit at T-2H on every training row
   against the backtest's fit: seconds and judged log loss (how much the sample costs the
   verdict).

Parts (``BENCH_SCALE_PARTS``, comma-separated, default all): ``loop`` (1), ``plan`` (2),
``families`` (3), ``backtest`` (4, fits every family's production fit first), ``refit`` (5,
with 4). Run: ``python -m bench network_scale`` (about 20 minutes on a 2-core box at 2M rows;
``BENCH_SCALE_PARTS=loop``: about 3).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROWS = int(os.environ.get("BENCH_SCALE_ROWS", "2000000"))
FEATURES = 46
PARTS = ("loop", "plan", "families", "backtest", "refit")
LOOP_EPOCHS = int(os.environ.get("BENCH_SCALE_LOOP_EPOCHS", "4"))
ROUNDS = int(os.environ.get("BENCH_SCALE_ROUNDS", "2"))


def _parts() -> set[str]:
    asked = os.environ.get("BENCH_SCALE_PARTS", "")
    parts = {p.strip() for p in asked.split(",") if p.strip()} or set(PARTS)
    unknown = parts - set(PARTS)
    if unknown:
        raise SystemExit(f"BENCH_SCALE_PARTS: unknown {sorted(unknown)} (parts: {PARTS})")
    return parts


def _snapshot(store, run_id: str, seed: int):
    from infra.storage.datasets import local_dataset_dir, read_dataset_manifest
    from tasks.ml.normalizer import Normalizer
    from tasks.ml.snapshot_reader import SnapshotStream
    from tests.fixtures.synthetic_snapshot import publish_synthetic_snapshot

    _, prepared = publish_synthetic_snapshot(
        store, run_id, rows=ROWS, n_features=FEATURES, seed=seed, files_per_split=8
    )
    manifest = read_dataset_manifest(store, prepared.snapshot_prefix)
    normalizer = Normalizer.model_validate(manifest.metadata["normalizer"])
    return SnapshotStream(local_dataset_dir(store, manifest), normalizer.features), normalizer


def _fit(kind: str, data, normalizer, settings, **spec):
    from tasks.ml.models import FitJob, get_family

    family = get_family(kind)
    started = time.perf_counter()
    outcome = family.fit(
        family.spec(spec), FitJob(data=data, normalizer=normalizer, settings=settings)
    )
    return outcome, time.perf_counter() - started


def _logloss(model, data, split: str) -> float:
    from tasks.ml.models import evaluate

    return evaluate(model, data, split, calibrated=False)["logloss"]


def _bare_loop(
    model: nn.Module,
    data,
    batch: int,
    threads: int,
    epochs: int,
    lr: float,
    chunk_rows: int | None = None,
):
    """Preloaded tensors, a permutation, gather (``index_select``: 3x faster than ``x[idx]``
    on this CPU, so the stronger baseline), step; validation each epoch; samples/s. The
    permutation is global, or with ``chunk_rows`` the order the fit's reader uses: blocks of
    that many rows in a random order, rows permuted within each (its gathers stay in cache)."""
    from tasks.ml.training_loop import network_logits

    torch.set_num_threads(threads)
    xs, ys = zip(*data.chunks("train"), strict=True)
    x, y = torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))
    val_x = np.concatenate([vx for vx, _ in data.chunks("val")])
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    loss_fn = nn.BCEWithLogitsLoss()
    gen = torch.Generator().manual_seed(0)
    samples, started = 0, time.perf_counter()
    for _ in range(epochs):
        model.train()
        for order in _epoch_order(len(y), gen, chunk_rows):
            for i in range(0, len(order), batch):
                idx = order[i : i + batch]
                xb, yb = torch.index_select(x, 0, idx), torch.index_select(y, 0, idx)
                loss = loss_fn(model(xb), yb)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                samples += len(idx)
        model.eval()
        network_logits(model, val_x)
    return samples / (time.perf_counter() - started)


def _epoch_order(rows: int, gen: torch.Generator, chunk_rows: int | None):
    """One epoch's row order: a global permutation, or blocks of ``chunk_rows`` in a random
    order, each permuted."""
    if not chunk_rows:
        yield torch.randperm(rows, generator=gen)
        return
    starts = torch.arange(0, rows, chunk_rows)
    for start in starts[torch.randperm(len(starts), generator=gen)].tolist():
        n = min(chunk_rows, rows - start)
        yield start + torch.randperm(n, generator=gen)


def _row(benchmark: str, subject: str, value, baseline: str, baseline_value, unit: str, **more):
    return {
        "benchmark": benchmark,
        "subject": subject,
        "value": value,
        "baseline": baseline,
        "baseline_value": baseline_value,
        "ratio": value / baseline_value if baseline_value else float("nan"),
        "unit": unit,
        **more,
    }


def _loop_rows(data, normalizer) -> list[dict]:
    """The fit through the seam against the bare loops, ``LOOP_EPOCHS`` epochs each (early
    stopping off, so every loop passes the same examples), ``ROUNDS`` rounds alternating; the
    best round of each (the machine's noise only ever slows a loop down)."""
    from infra.settings import TrainingSettings
    from tasks.ml.models.mlp import MLPFamily, MLPSpec

    settings = TrainingSettings(max_epochs=LOOP_EPOCHS, patience=LOOP_EPOCHS)
    orders = {"global shuffle": None, "the reader's order": data.chunk_rows}
    started = time.perf_counter()  # the snapshot's first read (the bare loops' preload) apart
    for split in ("train", "val"):
        for _ in data.chunks(split):
            pass
    first_read = time.perf_counter() - started
    best: dict[str, float] = {}
    rec: dict = {}
    for _ in range(ROUNDS):
        planned, _ = _fit("mlp", data, normalizer, settings)
        rec = planned.record
        fit = rec["samples_seen"] / sum(h.seconds for h in planned.history)
        best["fit"] = max(best.get("fit", 0.0), fit)
        for label, chunk_rows in orders.items():
            network = MLPFamily().build(MLPSpec(), _job(data, normalizer, settings))
            bare = _bare_loop(
                network,
                data,
                rec["batch_size"],
                rec["threads"],
                rec["epochs"],
                rec["scaled_learning_rate"],
                chunk_rows,
            )
            best[label] = max(best.get(label, 0.0), bare)
    subject = (
        f"mlp fit through the seam, {data.rows('train'):,} rows, batch {rec['batch_size']}, "
        f"{rec['threads']} threads, {rec['epochs']} epochs (best of {ROUNDS})"
    )
    return [
        _row(
            "scale_mlp_loop",
            subject,
            best["fit"],
            f"bare PyTorch loop, same tensors preloaded, batch, threads, epochs, {label}",
            best[label],
            "samples/s",
            first_read_s=round(first_read, 2),
        )
        for label in orders
    ]


def _plan_rows(data, normalizer) -> list[dict]:
    from infra.settings import TrainingSettings

    settings = TrainingSettings()
    planned, planned_s = _fit("mlp", data, normalizer, settings)
    rec = planned.record
    old_settings = TrainingSettings(max_batch_size=settings.batch_size, threads=1)
    old, old_s = _fit("mlp", data, normalizer, old_settings)
    new_ll, old_ll = _logloss(planned.model, data, "test"), _logloss(old.model, data, "test")
    return [
        _row(
            "scale_mlp_plan",
            f"mlp fit with the plan ({rec['epochs']} epochs, test log loss {new_ll:.4f})",
            old_s,
            f"batch 1024, 1 thread ({old.record['epochs']} epochs, test log loss {old_ll:.4f})",
            planned_s,
            "speed-up (old s / new s)",
            seconds=planned_s,
            baseline_seconds=old_s,
        )
    ]


def _job(data, normalizer, settings):
    from tasks.ml.models import FitJob

    return FitJob(data=data, normalizer=normalizer, settings=settings)


def _family_rows(data, normalizer) -> list[dict]:
    from infra.settings import TrainingSettings

    rows = []
    for kind in ("logistic", "gbm"):
        outcome, auto_s = _fit(kind, data, normalizer, TrainingSettings())
        _, one_s = _fit(kind, data, normalizer, TrainingSettings(threads=1))
        rows.append(
            _row(
                f"scale_family_{kind}",
                f"{kind} fit, {outcome.record['threads']} threads (the rule)",
                one_s,
                "the same fit on one thread",
                auto_s,
                "speed-up (1-thread s / rule s)",
                seconds=auto_s,
                baseline_seconds=one_s,
            )
        )
    return rows


def _backtest_rows(store, data, normalizer, refit: bool) -> list[dict]:
    """Each default contender's production fit on ``data``, then its backtest refit on an
    earlier snapshot (another seed) as the train stage runs it, judged on ``data``'s test split
    (the rows of the next window); for the mlp also the sample fit as it ran before (its own
    plan, no bound); with ``refit``, the full refit on every earlier training row."""
    from infra.settings import TrainingSettings
    from tasks.ml.backtest import backtest_fit_job
    from tasks.ml.models import get_family

    earlier, earlier_normalizer = _snapshot(store, "earlier", seed=1)
    settings = TrainingSettings()
    production_rows = data.rows("train")
    rows = []
    for kind in ("logistic", "gbm", "mlp"):
        production, production_s = _fit(kind, data, normalizer, settings)
        job = backtest_fit_job(
            earlier,
            earlier_normalizer,
            settings,
            _job(data, normalizer, settings).device,
            production_rows,
        )
        family = get_family(kind)
        started = time.perf_counter()
        backtest = family.fit(family.spec({}), job)
        backtest_s = time.perf_counter() - started
        judged = _logloss(backtest.model, data, "test")
        what = f"{job.data.rows('train'):,} of {earlier.rows('train'):,} rows"
        rows.append(
            _row(
                f"scale_backtest_{kind}",
                f"{kind} backtest fit, {what}{_epochs(backtest)} (judged log loss {judged:.4f})",
                backtest_s,
                f"{kind} production fit, {production_rows:,} rows{_epochs(production)} "
                f"(test log loss {_logloss(production.model, data, 'test'):.4f})",
                production_s,
                "backtest s / production s",
                seconds=backtest_s,
                baseline_seconds=production_s,
                judged_logloss=judged,
            )
        )
        if kind == "mlp":
            own, own_s = _fit(kind, job.data, earlier_normalizer, settings)
            own_ll = _logloss(own.model, data, "test")
            rows.append(
                _row(
                    "scale_backtest_mlp_own_plan",
                    f"mlp backtest fit as before: {what}, the sample's own plan, no bound"
                    f"{_epochs(own)} (judged log loss {own_ll:.4f})",
                    own_s,
                    f"mlp production fit, {production_rows:,} rows{_epochs(production)}",
                    production_s,
                    "backtest s / production s",
                    seconds=own_s,
                    baseline_seconds=production_s,
                    judged_logloss=own_ll,
                )
            )
        if refit:
            full, full_s = _fit(kind, earlier, earlier_normalizer, settings)
            full_ll = _logloss(full.model, data, "test")
            rows.append(
                _row(
                    f"scale_refit_{kind}",
                    f"{kind} backtest fit{_epochs(backtest)} (judged log loss {judged:.4f})",
                    full_s,
                    f"full refit on {earlier.rows('train'):,} rows{_epochs(full)} (judged log "
                    f"loss {full_ll:.4f})",
                    backtest_s,
                    "speed-up (full s / backtest s)",
                    seconds=backtest_s,
                    baseline_seconds=full_s,
                    judged_logloss=judged,
                    baseline_judged_logloss=full_ll,
                )
            )
    return rows


def _epochs(outcome) -> str:
    rec = outcome.record
    if "epochs" not in rec:
        return ""
    return f", batch {rec['batch_size']}, {rec['threads']} threads, {rec['epochs']} epochs"


def main(results_dir: Path) -> list[dict]:
    from infra.storage.store import LocalFolderStore

    parts = _parts()
    work = Path(tempfile.mkdtemp(prefix="hf-bench-scale-"))
    threads = torch.get_num_threads()
    try:
        store = LocalFolderStore(work / "store")
        data, normalizer = _snapshot(store, "scale", seed=0)
        rows: list[dict] = []
        if "loop" in parts:
            rows += _loop_rows(data, normalizer)
        if "plan" in parts:
            rows += _plan_rows(data, normalizer)
        if "families" in parts:
            rows += _family_rows(data, normalizer)
        if parts & {"backtest", "refit"}:
            rows += _backtest_rows(store, data, normalizer, refit="refit" in parts)
        return rows
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(work, ignore_errors=True)
