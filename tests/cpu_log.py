"""A pytest plugin that logs each test's CPU seconds, its own and those of every process it
started (JVMs, Prefect servers, CLI subprocesses, a stack's daemons), with its wall seconds: one
JSON line per test to ``$HYBRIDFLOW_TEST_CPU_LOG``. Each test process moves itself into a
cpuacct cgroup of its own (cgroup v1 at /sys/fs/cgroup/cpuacct, writable by root), which its
children inherit, and reads the group's usage around each test. On a loaded box wall seconds
stretch at random; CPU seconds stay close to an idle box's. docs/testing.md says how to use it:

    HYBRIDFLOW_TEST_CPU_LOG=/tmp/cpu.jsonl pytest -p tests.cpu_log -n 2 --dist loadfile ...
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_group: Path | None = None


def _usage() -> float:
    assert _group is not None
    return int((_group / "cpuacct.usage").read_text()) / 1e9


def pytest_configure(config: pytest.Config) -> None:
    global _group
    if not os.environ.get("HYBRIDFLOW_TEST_CPU_LOG"):
        raise pytest.UsageError("tests.cpu_log needs HYBRIDFLOW_TEST_CPU_LOG=<file to append to>")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    _group = CPUACCT / f"hybridflow-tests-{worker}-{os.getpid()}"
    try:
        _group.mkdir(exist_ok=True)
        (_group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as exc:
        raise pytest.UsageError(f"tests.cpu_log needs a writable cpuacct cgroup v1: {exc}") from exc


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    cpu, wall = _usage(), time.monotonic()
    yield
    line = {
        "test": item.nodeid,
        "cpu_s": round(_usage() - cpu, 2),
        "wall_s": round(time.monotonic() - wall, 2),
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
    }
    with open(os.environ["HYBRIDFLOW_TEST_CPU_LOG"], "a") as out:
        out.write(json.dumps(line) + "\n")
