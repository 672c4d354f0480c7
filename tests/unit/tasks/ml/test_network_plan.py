"""A network fit's batch, learning rate, warm-up and CPU threads, from the example count, the
network's size and the cores the stage owns (tasks.ml.network_plan), and a fit that uses them."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from infra.settings import TrainingSettings
from infra.storage.store import LocalFolderStore
from tasks.ml import network_fit as network_fit_module
from tasks.ml import network_plan as plan_module
from tasks.ml.models import FitJob, get_family
from tasks.ml.network_plan import SCALE_FROM_ROWS, network_plan, threads_for_step
from tests.fixtures.synthetic_snapshot import publish_synthetic_snapshot, synthetic_stream

MLP_PARAMS = 5121  # the default mlp on 46 features


def plan(rows: int, cores: int, processes: int = 1, **settings):
    return network_plan(
        TrainingSettings(**settings),
        train_rows=rows,
        parameters=MLP_PARAMS,
        learning_rate=2e-3,
        processes=processes,
        cores=cores,
    )


def test_a_small_run_keeps_the_base_batch_rate_and_one_thread():
    small = plan(14_000, cores=2)
    assert (small.batch_size, small.learning_rate, small.warmup_steps, small.threads) == (
        1024,
        2e-3,
        0,
        1,
    )


def test_the_batch_grows_with_the_examples_and_the_rate_by_its_square_root():
    big = plan(1_400_000, cores=2)  # 2M customers' training examples
    assert big.batch_size == 16_384
    assert big.learning_rate == pytest.approx(2e-3 * math.sqrt(16))
    assert big.warmup_steps > 0
    assert plan(300_000, cores=2).batch_size == 4096
    assert plan(2 * SCALE_FROM_ROWS - 1, cores=2).batch_size == 1024  # the 4.3M-event run's size
    assert plan(2 * SCALE_FROM_ROWS, cores=2).batch_size == 2048
    assert plan(300_000, cores=2, batch_size=32).batch_size == 128  # a batch set small stays so
    assert plan(1_400_000, cores=2, max_batch_size=1024).batch_size == 1024  # scaling off


def test_threads_are_sized_to_the_cores_the_stage_owns_and_the_step_work():
    assert plan(1_400_000, cores=2).threads == 2  # not 1: the step is large enough for both
    assert plan(1_400_000, cores=16).threads == threads_for_step(6.0 * MLP_PARAMS * 16_384, 16)
    wide = network_plan(
        TrainingSettings(), train_rows=1_400_000, parameters=200_000, learning_rate=1e-3, cores=16
    )
    assert wide.threads == 16  # a wide network's step is work for every core
    assert plan(1_400_000, cores=16, processes=8).threads == 1  # cores shared among ranks
    assert plan(1_400_000, cores=1).threads == 1
    assert plan(1_400_000, cores=2, threads=3).threads == 3  # HYBRIDFLOW_TRAIN__THREADS
    assert threads_for_step(1e12, 2) == 2 and threads_for_step(1e6, 64) == 1


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    store = LocalFolderStore(tmp_path_factory.mktemp("plan") / "store")
    _, prepared = publish_synthetic_snapshot(store, "plan", rows=3000, seed=3)
    return synthetic_stream(store, prepared)


def test_a_network_fit_runs_with_the_plan_and_records_it(snapshot, monkeypatch, caplog):
    """The fit's loop runs the plan's threads, and the process gets its own back after it
    (a one-thread plan must not slow what the process does next)."""
    data, normalizer = snapshot
    monkeypatch.setattr(plan_module, "available_cores", lambda: 2)
    monkeypatch.setattr(plan_module, "STEP_FLOPS_PER_THREAD", 1.0)  # any step is work for 2
    monkeypatch.setattr(plan_module, "SCALE_FROM_ROWS", 500)  # these rows count as many
    in_loop: list[int] = []
    real_loop = network_fit_module.train_model

    def loop(*args, **kwargs):
        in_loop.append(torch.get_num_threads())
        return real_loop(*args, **kwargs)

    monkeypatch.setattr(network_fit_module, "train_model", loop)
    before = torch.get_num_threads()
    settings = TrainingSettings(max_epochs=1, batch_size=8, max_batch_size=64, seed=1)
    try:
        torch.set_num_threads(1)
        with caplog.at_level(logging.INFO, logger="tasks.ml.network_fit"):
            outcome = get_family("mlp").fit(
                get_family("mlp").spec(),
                FitJob(data=data, normalizer=normalizer, settings=settings),
            )
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    threads = in_loop[0]
    assert after == 1
    record = outcome.record
    rows = data.rows("train")
    assert rows >= 2000 and record["batch_size"] == 32  # 8 x 4 (rows over 2,000), within 64
    assert record["steps"] == math.ceil(rows / 32)  # the loop stepped with the scaled batch
    assert record["scaled_learning_rate"] == pytest.approx(settings.learning_rate * 2)
    assert record["threads"] == threads == 2
    assert "2 torch threads per process" in caplog.text
