"""CPU seconds used by this process and all its descendants (JVM, Python workers), from /proc."""

from __future__ import annotations

import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, utime+stime+cutime+cstime in seconds) of ``pid``, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    ppid = int(fields[1])
    ticks = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return ppid, ticks / _TICKS


def tree_cpu_seconds(root: int | None = None) -> float:
    """CPU seconds of ``root`` (default: this process) and its live descendants; children that
    exited and were reaped are included through their parent's cutime/cstime."""
    root = root or os.getpid()
    if not Path("/proc").is_dir():
        return 0.0
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                parents[int(entry.name)], cpu[int(entry.name)] = stat
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += cpu.get(pid, 0.0)
        stack.extend(children.get(pid, []))
    return total


def own_cpu_seconds(pid: int) -> float | None:
    """utime + stime of ``pid`` alone (not its children), None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _status_mb(pid: int, field: str) -> float:
    """A memory figure of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``) in MB, 0 when gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def _program(pid: int) -> str:
    """The program name of ``pid`` (``/proc/<pid>/comm``), empty when it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _descendants(root: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                raw = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(raw[raw.rindex(")") + 2 :].split()[1])
            parents.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(parents.get(pid, []))
    return found


def run_measured(
    cmd: list[str],
    *,
    env: dict[str, str] | None = None,
    poll_s: float = 0.25,
    programs: set[str] | None = None,
    memory: dict[str, float] | None = None,
) -> tuple[float, float, str]:
    """Run ``cmd``; (wall seconds, CPU seconds of its whole process tree, stdout). CPU is
    sampled per process while it runs (a JVM its Python parent never reaps still counts);
    ``programs`` (when given) gets the name of every process seen in the tree (``java``:
    a JVM started); ``memory`` (when given) gets ``max_rss_mb``, the command's own process's
    peak resident memory (the kernel's high-water mark, ``VmHWM``), and ``max_tree_rss_mb``,
    the largest sum of resident memory of its tree seen at a sample."""
    import subprocess
    import tempfile
    import time

    seen: dict[int, float] = {}
    seen_names: set[int] = set()
    with tempfile.TemporaryFile("w+") as stdout:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=stdout, text=True)
        own_peak, tree_peak = 0.0, 0.0
        while proc.poll() is None:
            tree = 0.0
            for pid in _descendants(proc.pid):
                cpu = own_cpu_seconds(pid)
                if cpu is not None:
                    seen[pid] = max(seen.get(pid, 0.0), cpu)
                if programs is not None and pid not in seen_names:
                    seen_names.add(pid)
                    programs.add(_program(pid))
                if memory is not None:
                    tree += _status_mb(pid, "VmRSS")
            if memory is not None:
                own_peak = max(own_peak, _status_mb(proc.pid, "VmHWM"))
                tree_peak = max(tree_peak, tree)
            time.sleep(poll_s)
        if memory is not None:
            memory.update(max_rss_mb=round(own_peak, 1), max_tree_rss_mb=round(tree_peak, 1))
        wall = time.perf_counter() - started
        stdout.seek(0)
        out = stdout.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}")
    return wall, sum(seen.values()), out
