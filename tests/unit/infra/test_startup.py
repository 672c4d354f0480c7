"""A run's fixed cost: the steps from the process's start to its first stage (infra.startup)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra import startup


@pytest.fixture(autouse=True)
def _clean_marks():
    startup.reset()
    yield
    startup.reset()


def _at(monkeypatch, when: float) -> None:
    monkeypatch.setattr(startup.time, "time", lambda: when)


def test_the_steps_add_up_from_the_process_start_to_the_first_stage(monkeypatch):
    monkeypatch.setattr(startup, "process_started_at", lambda: 100.0)
    for name, when in [
        ("cli", 100.2),
        ("api_wait", 103.0),
        ("api_ready", 104.5),
        ("pipeline", 105.0),
        ("first_stage", 105.25),
    ]:
        _at(monkeypatch, when)
        startup.begin() if name == "cli" else startup.mark(name)
    steps = startup.startup_breakdown()
    assert steps == pytest.approx(
        {
            "interpreter": 0.2,
            "imports": 2.8,
            "prefect_api": 1.5,
            "pipeline_flow_run": 0.5,
            "planning": 0.25,
        }
    )
    assert sum(steps.values()) == pytest.approx(5.25)


def test_a_pipeline_outside_the_cli_counts_from_its_flow_body_and_a_second_one_anew(monkeypatch):
    assert startup.startup_breakdown() == {}  # nothing dispatched yet
    _at(monkeypatch, 10.0)
    startup.pipeline_started()
    _at(monkeypatch, 10.5)
    startup.mark("first_stage")
    assert startup.startup_breakdown() == pytest.approx({"planning": 0.5})
    _at(monkeypatch, 50.0)
    startup.pipeline_started()  # the same process runs another pipeline
    _at(monkeypatch, 50.2)
    startup.mark("first_stage")
    assert startup.startup_breakdown() == pytest.approx({"planning": 0.2})


def test_the_process_start_is_read_from_the_system():
    started = startup.process_started_at()
    assert started <= time.time() and time.time() - started < 24 * 3600


def test_the_process_start_is_its_age_on_the_boot_clock_not_the_whole_second_boot_time():
    # started 1,234.56 s after boot (123,456 ticks of 10 ms); the boot clock reads 1,300.25 s
    assert startup.started_at(10_000.0, 1_300.25, 123_456, 100) == pytest.approx(10_000 - 65.69)
    assert startup.started_at(10_000.0, 1.0, 200, 100) == 10_000.0, "never in the future"


def test_a_fresh_process_is_as_old_as_the_system_says(tmp_path):
    """Its age from process_started_at agrees with the kernel's own count (``/proc/uptime``
    and the process's start ticks) to the uptime's 10 ms, where btime's whole seconds were up
    to 1 s off."""
    probe = (
        "import os, time\n"
        "from infra.startup import process_started_at\n"
        "age = time.time() - process_started_at()\n"
        "up = float(open('/proc/uptime').read().split()[0])\n"
        "st = open('/proc/self/stat').read()\n"
        "ticks = int(st[st.rindex(')') + 2:].split()[19])\n"
        "print(age, up - ticks / os.sysconf('SC_CLK_TCK'))\n"
    )
    if not Path("/proc/uptime").exists():
        pytest.skip("no /proc")
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    age, kernel_age = (float(v) for v in done.stdout.split())
    assert age == pytest.approx(kernel_age, abs=0.05)


def test_work_waiting_for_the_first_stage_runs_once_when_it_is_dispatched():
    ran: list[str] = []
    startup.at_first_stage(lambda: ran.append("warm imports"))
    startup.mark("pipeline")
    assert ran == [], "nothing runs on the way to the first stage"
    startup.mark("first_stage")
    startup.mark("first_stage")
    assert ran == ["warm imports"]
    startup.at_first_stage(lambda: ran.append("late"))
    assert ran == ["warm imports", "late"], "registered after the first stage: runs at once"
