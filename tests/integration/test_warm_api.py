"""The warm Prefect API (infra.prefect_runtime.warm_api): the first command starts it, the next reuses it, two
racing commands start one, a record whose PID now names another process is replaced without
signalling that process, it stops itself once idle (that server: one start for both), and
`hybridflow down` stops it. Every server a test starts is stopped by its PID (each test has a
Prefect home of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.prefect_runtime.warm_api import WarmApiRecord, read_record, state_dir, write_record
from infra.stack.processes import ProcessRecord, is_alive, start_ticks, stop

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

# one command that runs a flow: attach to the API (warm by the environment), run, report
COMMAND = """
import json
from infra.prefect_runtime.env import configure_prefect_defaults
configure_prefect_defaults()
from infra.prefect_runtime import api as prefect_api
from prefect import flow

@flow(name="warm-api-probe", persist_result=False)
def probe() -> int:
    return 11

from infra.settings import get_settings
prefect_api.start_temporary_api(get_settings())
with prefect_api.prefect_api():
    assert probe() == 11
    # the record as it stands while this command holds its lease (the server cannot idle out)
    from infra.prefect_runtime.warm_api import read_record, state_dir
    recorded = read_record(state_dir())
api = prefect_api._started
print(json.dumps({"pid": api.record.pid, "started": api.started, "url": api.url,
                  "recorded_pid": recorded.pid if recorded else None}))
"""


@pytest.fixture
def home(tmp_path):
    """A Prefect home of this test's own; whatever warm API it recorded or started is stopped
    by PID at the end."""
    path = tmp_path / "prefect-home"
    path.mkdir()
    path = path.resolve()  # as the command's Prefect settings name it
    started: list[ProcessRecord] = []
    yield path, started
    record = read_record(state_dir(path))
    for process in [*started, *([record.process()] if record else [])]:
        stop(process, grace_s=10.0)


def command_env(home: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PREFECT_API_URL", None)
    pythonpath = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env | {
        "PREFECT_HOME": str(home),
        "HYBRIDFLOW_WARM_API": "true",
        "PYTHONPATH": pythonpath,
        **extra,
    }


def run_command(home: Path, started: list[ProcessRecord], **extra: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", COMMAND],
        env=command_env(home, **extra),
        cwd=home.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    started.append(server(report["pid"]))
    return report


def server(pid: int) -> ProcessRecord:
    """The server ``pid`` as a record with its start time (so no reused PID is signalled)."""
    return ProcessRecord(
        name="warm", pid=pid, start_ticks=start_ticks(pid), command=[], log_file=""
    )


def wait_until(condition, timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def test_the_next_command_reuses_the_warm_api_and_down_stops_it(home):
    path, started = home
    first = run_command(path, started)
    first_server = started[-1]
    assert first["started"] and is_alive(first_server), "it outlives its command"
    second = run_command(path, started)
    assert (second["pid"], second["url"], second["started"]) == (first["pid"], first["url"], False)

    from prefect.client.orchestration import SyncPrefectClient

    with SyncPrefectClient(first["url"]) as client:
        runs = client.read_flow_runs()
    assert sum(r.state is not None and r.state.is_completed() for r in runs) == 2
    assert not list((state_dir(path) / "users").iterdir()), "the commands' leases are released"

    down = subprocess.run(
        [sys.executable, "-m", "cli.main", "down"],
        env=command_env(path, HYBRIDFLOW_STACK_DIR=str(path.parent / "stack")),
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert down.returncode == 0, down.stderr[-2000:]
    assert f"warm Prefect API (pid {first['pid']}" in down.stdout and "stopped" in down.stdout
    assert not is_alive(first_server) and read_record(state_dir(path)) is None


def test_two_commands_racing_start_one_server(home):
    path, started = home
    env = command_env(path)
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", COMMAND],
            env=env,
            cwd=path.parent,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    reports = []
    for racer in racers:
        out, err = racer.communicate(timeout=300)
        assert racer.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
        started.append(server(reports[-1]["pid"]))
    assert reports[0]["pid"] == reports[1]["pid"]
    assert sorted(r["started"] for r in reports) == [False, True], "one started it, one reused"


def test_a_record_whose_pid_now_names_another_process_is_replaced_and_stops_itself_once_idle(
    home,
):
    """A server that died and whose PID was reused (here: this test's own PID, with another
    start time) must not be signalled: the record is replaced by a new server. That server (one
    start serves both checks: a warm API costs ~10 s of CPU) stops itself once idle and removes
    its record."""
    path, started = home
    folder = state_dir(path)
    folder.mkdir(parents=True)
    write_record(
        folder,
        WarmApiRecord(
            pid=os.getpid(),
            start_ticks=1,
            port=9,
            prefect_version="3.9.1",
            python=sys.executable,
            database="x",
            started_at=0.0,
            idle_seconds=60.0,
            log_file=str(folder / "api.log"),
        ),
    )
    report = run_command(path, started, HYBRIDFLOW_WARM_API_IDLE_SECONDS="1")
    assert report["started"] and report["pid"] != os.getpid()
    assert report["recorded_pid"] == report["pid"], "the record names the new server"
    assert wait_until(lambda: not is_alive(started[-1])), "it stayed up while idle"
    assert read_record(folder) is None, "its record is removed with it"
