"""`hybridflow up` failing half-way: the state file keeps every process that is still running, a
moto server that never comes up is stopped, and `down` then stops everything that is left.

The running stack is stood in for by real sleeping processes (the server and workers of an
earlier `up`), so no Prefect server is needed: the failure happens before `up` talks to one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from infra.settings import HybridflowSettings
from infra.stack import lifecycle, services
from infra.stack.processes import ProcessRecord, is_alive, kill_tree, launch
from infra.stack.spark_cluster import SparkClusterSpec

NEVER_READY = [sys.executable, "-c", "import time; time.sleep(600)"]


@pytest.fixture
def stack(tmp_path):
    """Settings for a stack in tmp_path, and every process the test starts (killed at the end)."""
    settings = HybridflowSettings(stack_dir=tmp_path / "stack", store=str(tmp_path / "store"))
    started: list[ProcessRecord] = []
    yield settings, started
    for record in started:
        kill_tree(record)


def _sleeper(name: str, tmp_path: Path, started: list[ProcessRecord]) -> ProcessRecord:
    record = launch(name, NEVER_READY, {}, tmp_path / f"{name}.log", tmp_path)
    started.append(record)
    return record


def _recorded(settings: HybridflowSettings) -> dict[str, ProcessRecord]:
    state = lifecycle.load_state(settings)
    return dict(state.processes) if state else {}


def test_a_moto_server_that_never_comes_up_is_stopped_and_nothing_is_forgotten(
    stack, tmp_path, monkeypatch
):
    settings, started = stack
    from infra.storage.store import open_store

    earlier = {
        key: _sleeper(key, tmp_path, started)
        for key in ("server", "worker-cpu-pool", "worker-gpu-pool")
    }
    lifecycle._save_state(
        settings,
        lifecycle.StackState(
            api_url="http://127.0.0.1:1/api",
            ui_url="http://127.0.0.1:1",
            project_dir=str(lifecycle.project_dir()),
            events=str(tmp_path),
            store=open_store(settings.store).uri,
            processes=earlier,
        ),
    )
    launched: list[ProcessRecord] = []
    real_launch = lifecycle.launch

    def recording_launch(*args, **kwargs) -> ProcessRecord:
        record = real_launch(*args, **kwargs)
        launched.append(record)
        started.append(record)
        return record

    monkeypatch.setattr(lifecycle, "launch", recording_launch)
    monkeypatch.setattr(services, "s3_command", lambda port: NEVER_READY)
    monkeypatch.setattr(lifecycle, "S3_READY_TIMEOUT_S", 1.0)

    options = lifecycle.UpOptions(  # the light stack: no PostgreSQL, no Spark cluster
        events=tmp_path, s3=True, deploy=False, db="sqlite", spark=SparkClusterSpec(workers=0)
    )
    with pytest.raises(RuntimeError, match="S3 server \\(moto\\) did not become ready"):
        lifecycle.up(settings, options)

    (s3,) = launched
    assert not is_alive(s3), "the moto server that never came up is still running"
    recorded = _recorded(settings)
    assert set(recorded) == set(earlier), "the state file lost processes that still run"
    assert all(is_alive(r) for r in recorded.values())

    lines = lifecycle.down(settings)
    assert len(lines) == 3 and not any(is_alive(r) for r in earlier.values()), lines
    assert lifecycle.load_state(settings) is None


def test_a_process_is_in_the_state_file_before_it_is_waited_for(stack, tmp_path, monkeypatch):
    settings, started = stack
    seen_while_waiting: dict[str, ProcessRecord] = {}

    def ready(record: ProcessRecord) -> None:
        started.append(record)
        seen_while_waiting.update(_recorded(settings))
        raise RuntimeError("never became ready")

    state = lifecycle.StackState(
        api_url="", ui_url="", project_dir=str(tmp_path), events="", store=""
    )
    with pytest.raises(RuntimeError, match="never became ready"):
        lifecycle._launch_recorded(settings, state, "s3", NEVER_READY, {}, ready)
    assert "s3" in seen_while_waiting, "a crash while waiting would have lost its PID"
    assert not is_alive(seen_while_waiting["s3"])
    assert "s3" not in _recorded(settings)


def test_down_finds_processes_recorded_by_a_crashed_up(stack, tmp_path):
    settings, started = stack
    state = lifecycle.StackState(
        api_url="", ui_url="", project_dir=str(tmp_path), events="", store=""
    )
    lifecycle._launch_recorded(settings, state, "server", NEVER_READY, {})
    started.extend(_recorded(settings).values())
    # the `up` process dies here (SIGKILL, power cut): only the state file remains
    survivor = _recorded(settings)["server"]
    assert is_alive(survivor)
    down = subprocess.run(
        [str(Path(sys.executable).parent / "hybridflow"), "down"],
        env={"HYBRIDFLOW_STACK_DIR": str(settings.stack_dir), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert down.returncode == 0, down.stderr
    assert f"server (pid {survivor.pid})" in down.stdout and not is_alive(survivor)
