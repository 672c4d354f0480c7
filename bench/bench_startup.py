"""A small run's fixed cost: ``hybridflow run`` on a small log, from the process's start to the
first stage (the summary's ``startup_seconds`` and its steps), with the warm Prefect API (the
default: the first run starts it, the next reuses it) against a temporary API per run
(``HYBRIDFLOW_WARM_API=false``, what every run did before), the first and the second run of
each, alternating so that both see the same load. Plus Prefect's own cost per flow run: a flow
of ``SUBFLOWS`` empty subflows against one of none, on the warm API.

Size: ``BENCH_STARTUP_CUSTOMERS`` demo customers (default 3,000: about 62,000 events). Each side
has a Prefect home of its own; the warm API is stopped by its PID at the end. The runs write
bytecode as a user's do (``PYTHONDONTWRITEBYTECODE`` is dropped for them: with it every run
compiled the project's modules again, ~0.4 s of CPU). Each row also has ``outside_stages_s``,
the pipeline's seconds outside its stages (flow-run bookkeeping, planning, the drift check,
waits for torch's import), beside ``stages_s``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench._proc import own_cpu_seconds, run_measured

SUBFLOWS = 10


def _run(events: Path, store: Path, home: Path, warm: bool) -> tuple[float, float, dict]:
    cli = str(Path(sys.executable).with_name("hybridflow"))
    cmd = [cli, "run", "--events", str(events), "--no-cache", "--json"]
    env = os.environ | {
        "HYBRIDFLOW_STORE": str(store),
        "PREFECT_HOME": str(home),
        "HYBRIDFLOW_WARM_API": "true" if warm else "false",
    }
    env.pop("PREFECT_API_URL", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    wall, cpu, out = run_measured(cmd, env=env)
    return wall, cpu, json.loads(out.strip().splitlines()[-1])


def _row(subject: str, warm: tuple[float, float, dict], base: tuple[float, float, dict]) -> dict:
    w_wall, w_cpu, w = warm
    b_wall, b_cpu, b = base
    return {
        "benchmark": "small run fixed cost",
        "subject": subject,
        "baseline": "a temporary Prefect API per run",
        "ratio": w["startup_seconds"] / b["startup_seconds"],
        "startup_s": w["startup_seconds"],
        "baseline_startup_s": b["startup_seconds"],
        "steps": w["startup"],
        "baseline_steps": b["startup"],
        "wall_s": round(w_wall, 1),
        "baseline_wall_s": round(b_wall, 1),
        "wall_ratio": w_wall / b_wall,
        "cpu_s": round(w_cpu, 1),
        "baseline_cpu_s": round(b_cpu, 1),
        "stages_s": round(sum(s["seconds"] for s in w["stages"]), 1),
        "outside_stages_s": round(w["seconds"] - sum(s["seconds"] for s in w["stages"]), 1),
        "baseline_outside_stages_s": round(
            b["seconds"] - sum(s["seconds"] for s in b["stages"]), 1
        ),
        "load": os.getloadavg()[0],
    }


def flow_run_cost(api_url: str, server_pid: int | None = None) -> dict:
    """Seconds a parent flow takes with ``SUBFLOWS`` empty subflows against with none, on the
    API at ``api_url``: Prefect's bookkeeping per flow run, with heartbeats as a ``hybridflow``
    command runs them (off without a server: each flow run's end would wait up to 1 s for its
    heartbeat thread, which no command pays); with the CPU seconds per flow run of this process
    (the client) and of the API's process ``server_pid`` (the server: most of it)."""
    from prefect import flow
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import temporary_settings

    from infra.prefect_runtime.api import own_api_settings
    from infra.prefect_runtime.env import heartbeats_only_for_a_server

    @flow(name="bench-empty", persist_result=False)
    def empty() -> None:
        return None

    @flow(name="bench-parent", persist_result=False)
    def parent(children: int) -> None:
        for _ in range(children):
            empty()

    def measured(children: int) -> tuple[float, float, float]:
        cpu, server = time.process_time(), own_cpu_seconds(server_pid) if server_pid else None
        started = time.perf_counter()
        parent(children)
        wall = time.perf_counter() - started
        server_after = own_cpu_seconds(server_pid) if server_pid else None
        server_cpu = server_after - server if server is not None and server_after else 0.0
        return wall, time.process_time() - cpu, server_cpu

    with heartbeats_only_for_a_server(), temporary_settings(updates=own_api_settings(api_url)):
        parent(0)  # warm-up: the client, the flow's registration
        alone = measured(0)
        with_children = measured(SUBFLOWS)
        # the flows' logs reach the API before the bench stops it (else: "Error logging to API")
        APILogWorker.drain_all(timeout=5)
    wall, client, server = ((w - a) / SUBFLOWS for w, a in zip(with_children, alone, strict=True))
    return {
        "benchmark": "small run fixed cost",
        "subject": f"Prefect's cost per flow run ({SUBFLOWS} empty subflows, warm API)",
        "baseline": "the parent flow alone",
        "ratio": with_children[0] / alone[0],
        "seconds_per_flow_run": round(wall, 3),
        "client_cpu_s_per_flow_run": round(client, 3),
        "server_cpu_s_per_flow_run": round(server, 3),
        "parent_alone_s": round(alone[0], 3),
        "load": os.getloadavg()[0],
    }


def main(results_dir: Path) -> list[dict]:
    """Two homes, four runs (temporary, warm, temporary, warm), then the empty-flow probe."""
    from infra.prefect_runtime.warm_api import read_record, state_dir, stop_warm_api
    from tasks.data.demo_events import DemoDataParams, generate_demo_events

    customers = int(os.environ.get("BENCH_STARTUP_CUSTOMERS", "3000"))
    work = Path(tempfile.mkdtemp(prefix="hf-bench-startup-"))
    warm_home, base_home = work / "warm-home", work / "temporary-home"
    rows = []
    try:
        events = work / "events"
        n = generate_demo_events(DemoDataParams(customers=customers, seed=5), events).events
        runs: dict[tuple[str, int], tuple[float, float, dict]] = {}
        for attempt in (1, 2):
            runs["base", attempt] = _run(events, work / "store-base", base_home, warm=False)
            runs["warm", attempt] = _run(events, work / "store-warm", warm_home, warm=True)
        for attempt, label in ((1, "first run (cold)"), (2, "second run")):
            rows.append(
                _row(f"{n:,} events, {label}", runs["warm", attempt], runs["base", attempt])
            )
        record = read_record(state_dir(warm_home))
        if record is not None:
            rows.append(flow_run_cost(record.url, record.pid))
    finally:
        print(stop_warm_api(warm_home), flush=True)
        shutil.rmtree(work, ignore_errors=True)
    return rows
