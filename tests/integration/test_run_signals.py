"""``hybridflow run`` killed from outside (``kill -9``, SIGTERM) leaves no process behind: the
temporary Prefect API and every other child die with it. Checked by PID (with each process's
start time, so a reused PID does not count) and by process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

API_MARK = b"prefect.server.api.server:create_app"
DEADLINE_S = 180.0


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) of a live process; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[1]), fields[0], int(fields[19])


def _descendants(root: int) -> dict[int, int]:
    """Every live descendant of ``root``: pid -> start time."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[1] != "Z":
                children.setdefault(stat[0], []).append(int(entry.name))
                starts[int(entry.name)] = stat[2]
    found, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = starts[child]
            todo.append(child)
    return found


def _alive(pid: int, start: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[1] != "Z" and stat[2] == start


def _group_alive(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                raw = (entry / "stat").read_text()
            except OSError:
                continue
            fields = raw[raw.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _start_run(demo_events: Path, tmp_path: Path) -> subprocess.Popen:
    env = dict(os.environ, HYBRIDFLOW_STORE=str(tmp_path / "store"))
    env.pop("PREFECT_API_URL", None)  # embedded: the CLI starts its own temporary API
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", "run", "--events", str(demo_events)],
        cwd=tmp_path,
        env=env,
        stdout=open(tmp_path / "stdout.log", "wb"),  # noqa: SIM115 - closed with the process
        stderr=open(tmp_path / "stderr.log", "wb"),  # noqa: SIM115
        start_new_session=True,  # its own process group: pgid == pid
    )


def _running_with_children(proc: subprocess.Popen, tmp_path: Path) -> dict[int, int]:
    """Wait until the run's temporary API is up and its flow has begun; its descendants then."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / "stderr.log").read_text()[-3000:]
        found = _descendants(proc.pid)
        began = "Beginning flow run" in (tmp_path / "stderr.log").read_text(errors="replace")
        if began and any(API_MARK in _cmdline(pid) for pid in found):
            return found
        time.sleep(0.2)
    raise AssertionError(f"the run did not start its flow within {DEADLINE_S:.0f} s")


def _survivors(children: dict[int, int], pgid: int) -> tuple[list[int], list[int]]:
    """Wait (up to the deadline) until every child and the process group are gone."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        left = [pid for pid, start in children.items() if _alive(pid, start)]
        group = _group_alive(pgid)
        if (not left and not group) or time.monotonic() > deadline:
            return left, group
        time.sleep(0.2)


def _describe(pids: list[int]) -> list[str]:
    return [f"{pid}: {_cmdline(pid)[:200]!r} ppid {(_stat(pid) or (0,))[0]}" for pid in pids]


@pytest.mark.slow(
    reason="a `hybridflow run` subprocess up to its first flow run (its temporary Prefect API started), for each signal"
)
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_killing_hybridflow_run_leaves_no_child_behind(demo_events, tmp_path, how):
    proc = _start_run(demo_events, tmp_path)
    children: dict[int, int] = {}
    try:
        children = _running_with_children(proc, tmp_path)
        os.kill(proc.pid, how)
        code = proc.wait(timeout=DEADLINE_S)
        left, group = _survivors(children, proc.pid)
    finally:  # leave nothing for the next test either way
        children |= _descendants(proc.pid)
        for pid in [p for p, start in children.items() if _alive(p, start)]:
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
    assert not left, f"survived the run: {_describe(left)}"
    assert not group, f"left in the run's process group: {_describe(group)}"
    if how == signal.SIGTERM:  # handled: unwound through the exit handlers, one line, no trace
        stderr = (tmp_path / "stderr.log").read_text(errors="replace")
        assert code == 143, stderr[-3000:]
        assert "Traceback" not in stderr, stderr[-3000:]
    else:
        assert code == -signal.SIGKILL
