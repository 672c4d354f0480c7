"""A run's fixed cost: the steps from the process's start to its first stage (infra.startup)."""

from __future__ import annotations

import time

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
