"""Background processes the stack starts: launch detached, record, check, stop (by PID only).

A record keeps the PID and the kernel's start time of that PID, so a PID reused by an unrelated
process after a reboot or crash is never signalled.
"""

from __future__ import annotations

import logging
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

log = logging.getLogger(__name__)


class ProcessRecord(BaseModel):
    """A process `hybridflow up` started."""

    name: str
    pid: int
    start_ticks: int | None
    command: list[str]
    log_file: str


def _proc_stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces; everything after the last ')' is fixed fields
    return raw[raw.rfind(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), None when unknown."""
    fields = _proc_stat(pid)
    return int(fields[19]) if fields else None


def is_alive(record: ProcessRecord) -> bool:
    """True when the recorded process still runs (and is the same process, not a reused PID)."""
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    fields = _proc_stat(record.pid)
    if fields is not None and fields[0] == "Z":
        return False
    if record.start_ticks is None or fields is None:
        return True
    return int(fields[19]) == record.start_ticks


def descendants(pid: int) -> list[int]:
    """PIDs of every process below ``pid`` (children first walk over /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _proc_stat(int(entry.name))
        if fields:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def launch(
    name: str,
    command: Sequence[str],
    env: dict[str, str],
    log_file: Path,
    cwd: Path,
    user: str | None = None,
) -> ProcessRecord:
    """Start ``command`` detached (own session), output appended to ``log_file``; as ``user``
    (root only: e.g. PostgreSQL, which refuses to run as root) when given."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            list(command),
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            user=user,
            group=pwd.getpwnam(user).pw_gid if user else None,
            extra_groups=[] if user else None,
        )
    return ProcessRecord(
        name=name,
        pid=proc.pid,
        start_ticks=start_ticks(proc.pid),
        command=list(command),
        log_file=str(log_file),
    )


def _signal_all(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_gone(record: ProcessRecord, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_alive(record):
            return True
        time.sleep(0.2)
    return not is_alive(record)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop(record: ProcessRecord, *, grace_s: float = 15.0, terms: int = 1) -> str:
    """Stop a recorded process and everything it started; returns what it took.

    ``terms`` SIGTERMs (a Prefect worker needs a second one to give up its flow runs), each
    followed by up to ``grace_s`` seconds of waiting, then SIGKILL for whatever is left.
    """
    if not is_alive(record):
        return "not running"
    below = descendants(record.pid)
    outcome = "killed"
    for attempt in range(terms):
        _signal_all([record.pid], signal.SIGTERM)
        if _wait_gone(record, grace_s if attempt == terms - 1 else min(grace_s, 5.0)):
            outcome = "stopped"
            break
    below = sorted(set(below) | set(descendants(record.pid)))
    if outcome == "killed":
        _signal_all([record.pid], signal.SIGKILL)
    _reap(record.pid)
    leftovers = [pid for pid in below if Path(f"/proc/{pid}").exists()]
    if leftovers:
        _signal_all(leftovers, signal.SIGTERM)
        time.sleep(1.0)
        _signal_all([p for p in leftovers if Path(f"/proc/{p}").exists()], signal.SIGKILL)
    return outcome


def kill_tree(record: ProcessRecord) -> list[int]:
    """SIGKILL the process and all its descendants at once (a machine failure, for tests)."""
    if not is_alive(record):
        return []
    pids = [record.pid, *descendants(record.pid)]
    _signal_all(pids, signal.SIGKILL)
    _reap(record.pid)
    return pids


Ready = Callable[[ProcessRecord], None]


class Launcher(Protocol):
    """Starts a process under ``key``, records it, waits for ``ready`` (stopping and dropping it
    when that fails); `hybridflow up` records into the stack state, tests into a dict."""

    def __call__(
        self,
        key: str,
        command: list[str],
        env: dict[str, str],
        ready: Ready,
        user: str | None = None,
    ) -> ProcessRecord: ...


def launcher_into(records: dict[str, ProcessRecord], log_dir: Path, cwd: Path) -> Launcher:
    """A :class:`Launcher` that keeps its records in ``records`` (tests and benchmarks; the
    caller stops them), logs in ``log_dir/<key>.log``."""

    def start(
        key: str, command: list[str], env: dict[str, str], ready: Ready, user: str | None = None
    ) -> ProcessRecord:
        record = launch(key, command, env, log_dir / f"{key}.log", cwd, user=user)
        records[key] = record
        try:
            ready(record)
        except BaseException:
            stop(record, grace_s=5)
            records.pop(key, None)
            raise
        return record

    return start
