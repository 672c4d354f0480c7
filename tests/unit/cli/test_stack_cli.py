"""`hybridflow status/down/up` without a running stack: clear answers, nothing started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HYBRIDFLOW = str(Path(sys.executable).parent / "hybridflow")


def _cli(*args: str, stack_dir: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"HYBRIDFLOW_STACK_DIR": str(stack_dir)}
    return subprocess.run([HYBRIDFLOW, *args], env=env, capture_output=True, text=True, timeout=120)


def test_status_down_and_a_bad_up_without_a_stack(tmp_path):
    stack_dir = tmp_path / "stack"
    status = _cli("status", stack_dir=stack_dir)
    assert status.returncode == 1 and "no stack running" in status.stdout
    assert "warm Prefect API of `hybridflow run`: not running" in status.stdout

    down = _cli("down", stack_dir=stack_dir)
    assert down.returncode == 0 and "nothing to stop" in down.stdout
    assert "warm Prefect API: none recorded" in down.stdout

    missing = tmp_path / "no-such-events"
    up = _cli("up", "--events", str(missing), "--port", "1", stack_dir=stack_dir)
    assert up.returncode == 2, up.stderr
    assert up.stderr.strip().splitlines() == [
        f"hybridflow: error: events {missing}: no such file or folder"
    ]
    assert not (stack_dir / "stack.json").exists(), "nothing may be started or recorded"
