"""The deployed stack's engines against what they replace, measured in the same run.

* Spark start-up per stage: what a dispatched CPU unit pays before its first Spark action, in a
  fresh process as a flow run is: a local[*] driver JVM of its own (the baseline) against a
  session on the stack's Spark Connect server (``hybridflow up``'s cluster: master, two workers,
  Connect). Runs alternate, the median of ``HYBRIDFLOW_BENCH_STACK_REPEATS`` (default 3) counts.
* Prefect's database: the server on SQLite (the baseline) against PostgreSQL (the stack's
  default): seconds until healthy, and API throughput under the load workers put on it
  (``THREADS`` clients each creating flow runs and moving them Pending -> Running -> Completed).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from infra.stack.services import free_port, server_command, wait_http_ok

FIRST_ACTION = """
import sys, time
started = time.perf_counter()
from infra.settings import HybridflowSettings
from infra.compute.spark import get_spark
spark = get_spark(HybridflowSettings(spark_remote=sys.argv[1] or None, spark_driver_memory="1g"))
spark.range(1000).count()
print(time.perf_counter() - started)
"""
THREADS, RUNS_PER_THREAD = 4, 25


def _first_action_s(remote: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", FIRST_ACTION, remote],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def spark_startup(work: Path, repeats: int) -> list[dict]:
    """Seconds to a first Spark action in a fresh process: local JVM vs Connect session."""
    from infra.settings import get_settings
    from infra.stack.processes import launcher_into
    from infra.stack.spark_cluster import spark_spec, start_cluster, stop_cluster

    records: dict = {}
    launch = launcher_into(records, work / "logs", work)
    try:
        endpoints = start_cluster(
            launch, work / "cluster", spark_spec(get_settings()), dict(os.environ)
        )
        local, connect = [], []
        for _ in range(repeats):
            local.append(_first_action_s(""))
            connect.append(_first_action_s(endpoints.remote))
    finally:
        stop_cluster(records)
    subject, baseline = statistics.median(connect), statistics.median(local)
    return [
        {
            "benchmark": "stack: Spark start-up per stage (fresh process to first action)",
            "subject": f"Spark Connect session {subject:.1f} s",
            "baseline": f"local[*] driver JVM {baseline:.1f} s",
            "ratio": baseline / subject,
            "runs_s": {"connect": connect, "local": local},
        }
    ]


def _start_server(work: Path, name: str, db_env: dict[str, str]) -> tuple[object, str, float]:
    from infra.stack.processes import launch

    port = free_port()
    env = dict(os.environ) | db_env
    env.update(PREFECT_HOME=str(work / name), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    started = time.perf_counter()
    record = launch(name, server_command(port), env, work / f"{name}.log", work)
    api = f"http://127.0.0.1:{port}/api"
    wait_http_ok(f"{api}/health", 180, f"Prefect server on {name}", work / f"{name}.log")
    return record, api, time.perf_counter() - started


def _api_load(api: str) -> float:
    """Flow runs per second through create + two state changes, ``THREADS`` clients at once."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Completed, Running

    @flow(name="bench-stack")
    def bench_stack() -> None:
        """Never run: only its name is registered with the runs."""

    def one_client(_: int) -> None:
        with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as c:
            for _ in range(RUNS_PER_THREAD):
                run = c.create_flow_run(bench_stack)
                c.set_flow_run_state(run.id, Running())
                c.set_flow_run_state(run.id, Completed())

    one_client(0)  # warm: the flow's row, connection pools
    started = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(one_client, range(THREADS)))
    return THREADS * RUNS_PER_THREAD / (time.perf_counter() - started)


def prefect_database(work: Path) -> list[dict]:
    """The Prefect server on SQLite vs PostgreSQL: start-up and API throughput."""
    from infra.stack import postgres
    from infra.stack.processes import launcher_into, stop

    results, records = {}, {}
    pg_dir = work / "postgres"
    launch = launcher_into(records, work, work)
    info = postgres.start(launch, pg_dir, dict(os.environ), work / "initdb.log")
    try:
        for name, db_env in (
            ("sqlite", {}),
            ("postgres", postgres.prefect_server_env(info, postgres.password(pg_dir))),
        ):
            record, api, start_s = _start_server(work, name, db_env)
            try:
                results[name] = (start_s, _api_load(api))
            finally:
                stop(record, grace_s=10)
    finally:
        stop(records[postgres.KEY], grace_s=20)
    (sqlite_start, sqlite_rate), (pg_start, pg_rate) = results["sqlite"], results["postgres"]
    return [
        {
            "benchmark": f"stack: Prefect API, {THREADS} clients x {RUNS_PER_THREAD} flow runs",
            "subject": f"PostgreSQL {pg_rate:.1f} runs/s",
            "baseline": f"SQLite {sqlite_rate:.1f} runs/s",
            "ratio": pg_rate / sqlite_rate,
        },
        {
            "benchmark": "stack: Prefect server start to healthy",
            "subject": f"PostgreSQL {pg_start:.1f} s",
            "baseline": f"SQLite {sqlite_start:.1f} s",
            "ratio": sqlite_start / pg_start,
        },
    ]


def main(results_dir: Path) -> list[dict]:
    """Both comparisons in a folder the ``postgres`` user can reach (as root)."""
    repeats = int(os.environ.get("HYBRIDFLOW_BENCH_STACK_REPEATS", "3"))
    work = Path(tempfile.mkdtemp(prefix="hf-bench-stack-"))
    os.chmod(work, 0o711)
    try:
        return spark_startup(work, repeats) + prefect_database(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
