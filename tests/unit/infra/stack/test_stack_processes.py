"""The stack's process bookkeeping: detached launch, liveness, stop with descendants, PID reuse."""

from __future__ import annotations

import os
import sys
import time

from infra.stack.processes import descendants, is_alive, kill_tree, launch, stop

# a parent that starts a child of its own (like a worker starting a flow-run process) and
# ignores the first SIGTERM (like a busy Prefect worker)
PARENT = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, lambda *a: signal.signal(signal.SIGTERM, signal.SIG_DFL))
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(120)
"""


def _child_pid(log_file, timeout=20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log_file.read_text().strip()
        if text:
            return int(text.splitlines()[0])
        time.sleep(0.05)
    raise AssertionError("the parent did not report its child")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return open(f"/proc/{pid}/stat").read().split(") ")[1].startswith("Z")


def test_stop_takes_two_sigterms_and_the_child_in_its_own_session(tmp_path):
    log_file = tmp_path / "parent.log"
    record = launch("parent", [sys.executable, "-c", PARENT], dict(os.environ), log_file, tmp_path)
    child = _child_pid(log_file)
    assert is_alive(record)
    assert child in descendants(record.pid)

    assert stop(record, grace_s=2.0, terms=2) == "stopped"
    assert not is_alive(record)
    deadline = time.monotonic() + 5
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(child), "the child in its own session survived stop()"
    assert stop(record) == "not running"


def test_a_reused_pid_is_never_signalled(tmp_path):
    record = launch(
        "sleeper",
        [sys.executable, "-c", "import time; time.sleep(60)"],
        dict(os.environ),
        tmp_path / "s.log",
        tmp_path,
    )
    try:
        impostor = record.model_copy(update={"start_ticks": (record.start_ticks or 0) + 1})
        assert not is_alive(impostor)
        assert stop(impostor) == "not running"
        assert kill_tree(impostor) == []
        assert is_alive(record), "the real process was signalled through a stale record"
    finally:
        assert record.pid in kill_tree(record)
    deadline = time.monotonic() + 5
    while is_alive(record) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not is_alive(record)
