"""Training on a folder store: streaming, determinism, exact resume, warm start."""

from __future__ import annotations

import pytest
import torch

from infra.settings import HybridflowSettings, TrainingSettings
from infra.storage.registry import ModelRegistry
from infra.storage.store import LocalFolderStore
from tasks.ml.checkpoints import CheckpointPolicy, CheckpointStore
from tasks.ml.models import FitJob
from tasks.ml.models.mlp import MLPFamily, MLPSpec, network_from_state
from tasks.ml.normalizer import Normalizer
from tasks.ml.snapshot_reader import SnapshotStream
from tasks.ml.training_loop import train_model
from tasks.stages.train import TrainingOptions, train_stage
from tests.fixtures.synthetic_snapshot import publish_synthetic_snapshot, synthetic_stream

CPU = torch.device("cpu")


def build_model(normalizer, settings):
    """A fresh MLP of the default spec, seeded like the train stage builds it."""
    job = FitJob(data=None, normalizer=normalizer, settings=settings)  # type: ignore[arg-type]
    return MLPFamily().build(MLPSpec(), job)


@pytest.fixture
def store(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what train_stage picks for a model this small
    yield LocalFolderStore(tmp_path / "store")
    torch.set_num_threads(threads)


def _stream(store, prepared, chunk_rows=700) -> tuple[SnapshotStream, Normalizer]:
    return synthetic_stream(store, prepared, chunk_rows=chunk_rows)


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_stream_partitions_each_epoch_across_ranks_and_skips_to_a_position(store):
    _, prepared = publish_synthetic_snapshot(store, "r", rows=3000, seed=1)
    data, _ = _stream(store, prepared)
    n_train = prepared.split_counts["train"]
    assert data.rows("train") == n_train
    assert sum(data.chunk_lengths("train")) == n_train and max(data.chunk_lengths("train")) == 700

    def indices(**kw):
        return [g for g, _, _ in data.minibatches(seed=7, epoch=2, batch_size=64, **kw)]

    usable = data.batches_per_epoch(64, world_size=2)
    ranks = [indices(rank=r, world_size=2) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == usable // 2
    assert sorted(ranks[0] + ranks[1]) == list(range(usable))
    assert indices(start=5) == list(range(5, data.batches_per_epoch(64)))

    def labels(epoch, start=0):
        out = data.minibatches(seed=7, epoch=epoch, batch_size=64, start=start)
        return [y for _, _, y in out]

    assert all(torch.equal(a, b) for a, b in zip(labels(2)[5:], labels(2, start=5), strict=True))
    assert not torch.equal(torch.cat(labels(1)), torch.cat(labels(2)))  # reshuffled per epoch


def test_fingerprint_follows_content_not_file_names(store):
    _, first = publish_synthetic_snapshot(store, "a", rows=2000, seed=4, files_per_split=2)
    _, again = publish_synthetic_snapshot(store, "b", rows=2000, seed=4, files_per_split=3)
    _, other = publish_synthetic_snapshot(store, "c", rows=2000, seed=5)
    fp = [_stream(store, p)[0].fingerprint() for p in (first, again, other)]
    assert fp[0] == fp[1] != fp[2]


def test_same_seed_gives_the_same_weights_and_resume_matches_an_uninterrupted_run(store):
    _, prepared = publish_synthetic_snapshot(store, "r", rows=3000, seed=2)
    data, normalizer = _stream(store, prepared)
    settings = TrainingSettings(batch_size=64, max_epochs=3, patience=5, threads=1)

    straight = train_model(build_model(normalizer, settings), data, settings, CPU)
    again = train_model(build_model(normalizer, settings), data, settings, CPU)
    assert _same_weights(straight.model, again.model)

    ckpts = CheckpointStore(store, "t-unit", keep=2)

    def save(state, progress):
        ckpts.save(
            state,
            step=progress.step,
            epoch=progress.epoch,
            batch=progress.batch,
            samples_seen=progress.samples,
        )

    first = train_model(
        build_model(normalizer, settings),
        data,
        settings,
        CPU,
        save=save,
        policy=CheckpointPolicy(every_steps=20, every_seconds=0),
        stop_after_steps=50,  # mid-way through epoch 2
    )
    assert first.interrupted and first.progress.epoch == 2
    assert [m.step for m in ckpts.manifests()] == [50, 40]
    loaded = ckpts.latest_valid()
    resumed = train_model(
        network_from_state(loaded.state), data, settings, CPU, resume=loaded.state
    )
    assert resumed.resumed_from_step == 50
    assert resumed.progress.step == straight.progress.step
    assert _same_weights(resumed.model, straight.model)
    assert [h.val_logloss for h in resumed.history] == [h.val_logloss for h in straight.history]

    # a checkpoint written before the loop had its own AdamW and plateau schedule: the state
    # torch.optim.AdamW and ReduceLROnPlateau wrote resumes to the same weights
    old = torch_written(loaded.state)
    assert old["scheduler"] == loaded.state["scheduler"]  # the loop writes torch's format
    assert old["optimizer"]["param_groups"] == loaded.state["optimizer"]["param_groups"]
    resumed_old = train_model(network_from_state(old), data, settings, CPU, resume=old)
    assert _same_weights(resumed_old.model, straight.model)
    assert [h.learning_rate for h in resumed_old.history] == [
        h.learning_rate for h in straight.history
    ]


def torch_written(state: dict) -> dict:
    """``state`` with its optimiser and scheduler state as torch.optim's own objects write them
    (what checkpoints held before tasks.ml.adamw)."""
    network = network_from_state(state)
    optimizer = torch.optim.AdamW(network.parameters())
    optimizer.load_state_dict(state["optimizer"])
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    scheduler.load_state_dict(state["scheduler"])
    return dict(state, optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict())


def test_warm_start_reaches_scratch_quality_in_fewer_steps(store):
    settings = HybridflowSettings(
        train={
            "batch_size": 64,
            "max_epochs": 25,
            "patience": 2,
            "threads": 1,
            "families": ["mlp"],  # the network's warm start and resume
        },
        checkpoint={"every_steps": 0, "every_seconds": 0},
    )
    feats, old = publish_synthetic_snapshot(store, "old", rows=4000, seed=21)
    _, new = publish_synthetic_snapshot(store, "new", rows=4000, seed=22)
    kw = {"as_of": feats.as_of, "horizon_days": 90, "device_preference": "cpu"}
    production = train_stage(store, old, settings, **kw).result
    assert production.promoted and not production.warm_start

    warm = train_stage(store, new, settings, **kw).result
    scratch = train_stage(store, new, settings, options=TrainingOptions(scratch=True), **kw).result
    assert warm.warm_start and warm.parent_version == production.model_version
    assert not scratch.warm_start and scratch.parent_version is None
    assert warm.training_id != scratch.training_id
    assert warm.steps < scratch.steps, (warm.steps, scratch.steps)
    assert warm.metrics["auc"] >= scratch.metrics["auc"] - 0.005, (warm.metrics, scratch.metrics)
    manifest = ModelRegistry(store).get(warm.model_version)
    assert manifest.warm_start and manifest.parent_version == production.model_version

    # a re-run of a finished training reuses its version instead of training again
    rerun = train_stage(store, new, settings, options=TrainingOptions(scratch=True), **kw).result
    assert rerun.model_version == scratch.model_version and rerun.training_id == scratch.training_id
    fresh = train_stage(
        store, new, settings, options=TrainingOptions(scratch=True, fresh=True), **kw
    )
    assert fresh.result.model_version != scratch.model_version
