"""A run's fixed cost: when this process started and the moments on its way to the first stage.

``hybridflow run`` marks each step before the pipeline's first stage begins: the CLI's entry
(``cli``: the interpreter's start and the CLI's own imports before it), the wait for Prefect's
API (``api_wait``/``api_ready``: the commands' imports happen before the wait), the pipeline's
flow body (``pipeline``: Prefect created its flow run) and the first stage dispatched
(``first_stage``: the plan and its artifact before it). :func:`startup_breakdown` turns the
marks into seconds per step; their sum is the run summary's ``startup_seconds``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

STEPS = (
    ("interpreter", "cli"),
    ("imports", "api_wait"),
    ("prefect_api", "api_ready"),
    ("pipeline_flow_run", "pipeline"),
    ("planning", "first_stage"),
)
_marks: dict[str, float] = {}
_at_first_stage: list[Callable[[], None]] = []


def process_started_at() -> float:
    """This process's start as epoch seconds (Linux: its age from ``/proc``; elsewhere: now)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22: starttime
    except (OSError, ValueError, IndexError):
        return time.time()
    return started_at(time.time(), time.clock_gettime(time.CLOCK_BOOTTIME), ticks)


def started_at(now: float, since_boot: float, start_ticks: int, ticks_per_s: int = 0) -> float:
    """A process's start as epoch seconds from its start in clock ticks after boot (``/proc``'s
    ``starttime``, counted on the boot-time clock) and that clock now (``since_boot``) at epoch
    ``now``. Not ``now`` minus the boot's epoch (``/proc/stat``'s ``btime``): that is whole
    seconds, so the start came out up to 1 s early (0.96 s on the box of 3 Dec)."""
    ticks_per_s = ticks_per_s or os.sysconf("SC_CLK_TCK")
    return now - max(0.0, since_boot - start_ticks / ticks_per_s)


def begin() -> None:
    """Mark the process's start (the origin) and the CLI's entry: called by the CLI first."""
    _marks.setdefault("origin", process_started_at())
    mark("cli")


def mark(name: str) -> None:
    """Record the first time ``name`` is reached (later calls keep the first); the first
    ``first_stage`` runs what :func:`at_first_stage` registered."""
    if name in _marks:
        return
    _marks[name] = time.time()
    if name == "first_stage":
        while _at_first_stage:
            _at_first_stage.pop(0)()


def at_first_stage(action: Callable[[], None]) -> None:
    """Run ``action`` once, when the first stage is dispatched (at once if it was): work that
    would slow the way to it, e.g. importing what a later stage needs in the background."""
    if "first_stage" in _marks:
        action()
    else:
        _at_first_stage.append(action)


def startup_breakdown() -> dict[str, float]:
    """Seconds of each step from the process's start (or, without the CLI's :func:`begin`, the
    pipeline's flow body) to the first stage; steps not marked are left out."""
    origin = _marks.get("origin", _marks.get("pipeline"))
    if origin is None or "first_stage" not in _marks:
        return {}
    steps = STEPS if "origin" in _marks else STEPS[-1:]
    out: dict[str, float] = {}
    previous = origin
    for step, name in steps:
        at = _marks.get(name)
        if at is None or at < previous:
            continue
        out[step] = round(at - previous, 3)
        previous = at
    return out


def pipeline_started() -> None:
    """Mark a pipeline's flow body; a second pipeline in this process starts its own count
    there (its fixed cost is not the process's start)."""
    if "first_stage" in _marks:
        reset()
    mark("pipeline")


def reset() -> None:
    """Forget every mark (and what waits for the first stage)."""
    _marks.clear()
    _at_first_stage.clear()
