"""The device a stage computes on is a plain value: choosing it on a machine without a GPU
driver, and naming it, import no torch (a fresh interpreter, since this one has torch)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from infra.compute.devices import (
    Device,
    available_cores,
    gpu_driver_present,
    intra_op_threads,
    select_device,
)

WITHOUT_A_DRIVER = """
import json, sys
import infra.compute.devices as devices
devices.gpu_driver_present = lambda *patterns: False
chosen = [str(devices.select_device(p)) for p in ("auto", "cuda", "cpu")]
print(json.dumps({"chosen": chosen, "threads": devices.intra_op_threads(),
                  "cores": devices.available_cores(), "torch": "torch" in sys.modules}))
"""


def test_without_a_gpu_driver_the_device_is_the_cpu_and_torch_stays_unloaded():
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_A_DRIVER],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["chosen"] == ["cpu", "cpu", "cpu"]
    assert found["threads"] == found["cores"]  # torch's setting cannot have been lowered
    assert found["torch"] is False


def test_a_gpu_driver_is_found_by_its_device_node(tmp_path):
    assert not gpu_driver_present((str(tmp_path / "nvidia*"), str(tmp_path / "kfd")))
    (tmp_path / "nvidiactl").touch()
    assert gpu_driver_present((str(tmp_path / "nvidia*"), str(tmp_path / "kfd")))


def test_the_device_is_named_as_torch_names_it():
    assert str(Device()) == "cpu" and Device().as_torch() == torch.device("cpu")
    gpu = Device(type="cuda", index=1)
    assert str(gpu) == "cuda:1" and gpu.as_torch() == torch.device("cuda", 1)
    assert gpu.type == gpu.as_torch().type and gpu.index == gpu.as_torch().index
    with pytest.raises(ValueError, match="device must be auto, cuda or cpu, not 'gpu'"):
        select_device("gpu")


def test_scoring_threads_follow_torch_once_torch_is_loaded():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # as a Spark task or the endpoint does
        assert intra_op_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert intra_op_threads() == before
    assert available_cores() >= 1
