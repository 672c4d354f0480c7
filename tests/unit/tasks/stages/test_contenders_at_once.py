"""An embedded run fits its contenders at the same time, a thread each, when every fit is
one-threaded: the rule (:func:`contenders_at_once`), the runner (subflows started in order, at
most so many at once, the first failure raised after the others ended), torch's thread setting
under fits on several threads, and the fits themselves: the same models as one after another."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import torch

from flows.context import unit_began
from flows.executors import run_subflows_at_once
from infra.settings import HybridflowSettings
from infra.storage.store import LocalFolderStore
from tasks.ml.models.base import torch_threads
from tasks.ml.snapshot_reader import shared_reads
from tasks.policy.contending import TrainingOptions, contenders_at_once, longest_first
from tasks.stages.train_process import contender_for_run
from tests.fixtures.synthetic_snapshot import publish_synthetic_snapshot

CPU4 = dict.fromkeys(["rfm", "logistic", "gbm", "mlp"], "cpu")


@pytest.mark.parametrize(
    ("train", "rows", "devices", "cores", "expected"),
    [
        ({}, 12_502, CPU4, 2, 2),  # the 431k-event demo on a 2-core box
        ({}, 125_013, CPU4, 8, 4),  # one per core, at most one per contender
        ({}, 12_502, CPU4, 1, 1),
        ({}, 200_000, CPU4, 2, 1),  # fits plan more than one thread from here
        ({"threads": 2}, 12_502, CPU4, 2, 1),
        ({"threads": 1}, 12_502, CPU4, 2, 2),
        ({"ddp_processes": 2}, 12_502, CPU4, 2, 1),
        ({}, 12_502, {"gbm": "cpu", "mlp": "cuda"}, 2, 1),
        ({}, 12_502, dict.fromkeys(["gbm", "mlp", "sequence"], "cpu"), 2, 1),  # two networks
        ({}, 12_502, dict.fromkeys(["gbm", "mlp", "sequence"], "cpu"), 2, 1),
        ({"contenders_at_once": 1}, 12_502, CPU4, 2, 1),
        ({"contenders_at_once": 3}, 500_000, CPU4, 2, 3),  # the setting wins
        ({"contenders_at_once": 8}, 12_502, CPU4, 2, 4),
    ],
)
def test_contenders_at_once(train, rows, devices, cores, expected):
    settings = HybridflowSettings(train=train)
    assert contenders_at_once(settings, rows, devices, cores=cores) == expected


def test_a_network_starts_first():
    assert longest_first(["rfm", "logistic", "gbm", "mlp"]) == ["mlp", "rfm", "logistic", "gbm"]


def test_subflows_start_in_order_at_most_so_many_at_once():
    lock = threading.Lock()
    began: list[int] = []
    running, most = [0], [0]

    def subflow(p: int) -> None:
        unit_began()
        with lock:
            began.append(p)
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05 if p % 2 else 0.01)
        with lock:
            running[0] -= 1

    run_subflows_at_once(subflow, list(range(6)), 2)  # type: ignore[arg-type]
    assert began == list(range(6)) and most[0] == 2


def test_the_first_failure_is_raised_once_the_others_ended():
    ended: list[int] = []

    def subflow(p: int) -> None:
        if p == 1:
            time.sleep(0.02)
            raise ValueError("contender 1 failed")  # before its body began: no hang either
        unit_began()
        time.sleep(0.1)
        ended.append(p)

    with pytest.raises(ValueError, match="contender 1 failed"):
        run_subflows_at_once(subflow, [0, 1, 2, 3], 2)  # type: ignore[arg-type]
    assert ended == [0]  # the one beside it ended; none started after the failure


def test_torch_threads_restored_when_the_last_open_block_ends():
    before = torch.get_num_threads()
    outer, inner = torch_threads(1), torch_threads(2)
    outer.__enter__()
    inner.__enter__()
    assert torch.get_num_threads() == 2
    outer.__exit__(None, None, None)  # another thread's fit ends first: the other's stays
    assert torch.get_num_threads() == 2
    inner.__exit__(None, None, None)
    assert torch.get_num_threads() == before
    with torch_threads(1):
        with torch_threads(2):
            pass
        assert torch.get_num_threads() == 1  # nested in one thread: the outer block's again
    assert torch.get_num_threads() == before


FAMILIES = ["rfm", "logistic", "gbm", "mlp"]


def _fits(tmp_path, name: str, at_once: int, shared: bool = False) -> dict[str, dict[str, float]]:
    store = LocalFolderStore(tmp_path / name)
    publish_synthetic_snapshot(store, "run-1", rows=3000, seed=5)
    settings = HybridflowSettings(train={"families": FAMILIES})
    results: dict[str, dict[str, float]] = {}

    def fit(family: str) -> None:
        unit_began()
        unit = contender_for_run(
            store, "run-1", settings, family, device_preference="cpu", options=TrainingOptions()
        )
        assert unit is not None
        results[family] = unit.manifest.metrics | {
            "epochs": float(unit.manifest.training.get("epochs", 0))
        }

    with shared_reads() if shared else contextlib.nullcontext():
        run_subflows_at_once(fit, FAMILIES, at_once)  # type: ignore[arg-type]
    return results


def test_fits_on_threads_are_the_fits_one_after_another(tmp_path):
    threads = torch.get_num_threads()
    alone = _fits(tmp_path, "alone", 1)
    together = _fits(tmp_path, "together", 2)
    assert together == alone
    assert torch.get_num_threads() == threads
    # sharing the decoded snapshot, as run_contenders_in_process does, changes no figure
    assert _fits(tmp_path, "shared", 2, shared=True) == alone
    assert _fits(tmp_path, "shared-alone", 1, shared=True) == alone


def test_a_shared_fact_is_computed_once_by_fits_on_threads():
    from tasks.ml.snapshot_reader import memoised

    calls: list[int] = []

    def compute() -> int:
        calls.append(1)
        time.sleep(0.05)
        return 42

    key = ("test-fact", time.time())
    threads = [threading.Thread(target=lambda: memoised("fact", key, compute)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert memoised("fact", key, compute) == 42 and len(calls) == 1
