"""`hybridflow up`'s production engines: the Prefect server's database and the Spark cluster.

Each ``ensure_*`` keeps what still runs and starts what is missing, returning the processes to
record in the stack state (the same :class:`ProcessRecord` records as the server and workers,
so ``down`` stops them by PID) and a line per action for the user.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from infra.settings import StackDatabase
from infra.stack import postgres, spark_cluster
from infra.stack.postgres import DatabaseInfo
from infra.stack.processes import Launcher, ProcessRecord, is_alive, stop
from infra.stack.spark_cluster import SparkClusterSpec, SparkEndpoints

if TYPE_CHECKING:
    from infra.stack.lifecycle import StackState


def sqlite_info(stack_dir: Path) -> DatabaseInfo:
    """The Prefect server's default SQLite database under the stack's PREFECT_HOME."""
    return DatabaseInfo(kind="sqlite", location=str(stack_dir / "prefect" / "prefect.db"))


def ensure_database(
    launch: Launcher, stack_dir: Path, kind: StackDatabase, state: StackState, lines: list[str]
) -> dict[str, str]:
    """The Prefect server's database (started before it, through ``launch``), recorded in
    ``state``; returns the environment only the server's process gets (it holds the password).
    A running server on another database is stopped, so that `up` starts it again on this one."""
    previous = state.database
    running = state.processes.get(postgres.KEY)
    state.database = info = _database(launch, stack_dir, kind, previous, running, lines)
    server = state.processes.get("server")
    if previous is not None and previous != info and server and is_alive(server):
        lines.append(f"server (pid {server.pid}): {stop(server, grace_s=10)} (database changed)")
    if info.kind != "postgres":
        return {}
    return postgres.prefect_server_env(info, postgres.password(stack_dir / "postgres"))


def _database(
    launch: Launcher,
    stack_dir: Path,
    kind: StackDatabase,
    previous: DatabaseInfo | None,
    running: ProcessRecord | None,
    lines: list[str],
) -> DatabaseInfo:
    if kind == "sqlite":
        return sqlite_info(stack_dir)
    if previous and previous.kind == "postgres" and running and is_alive(running):
        lines.append(f"PostgreSQL already running (pid {running.pid})")
        return previous
    pg_dir = stack_dir / "postgres"
    reused = (pg_dir / "data" / "PG_VERSION").is_file()
    info = postgres.start(
        launch,
        pg_dir,
        dict(os.environ),
        stack_dir / "logs" / "postgres-initdb.log",
        port=previous.port if previous else None,
    )
    lines.append(
        f"started PostgreSQL on 127.0.0.1:{info.port}, "
        + ("existing data" if reused else "new data folder")
    )
    return info


def ensure_spark(
    launch: Launcher,
    stack_dir: Path,
    spec: SparkClusterSpec,
    state: StackState,
    env: dict[str, str],
    lines: list[str],
) -> None:
    """The Spark cluster in ``state.spark`` (None with no workers wanted), its processes
    recorded by ``launch``; ``env`` reaches the executors (the store's endpoint). A complete
    cluster of the wanted size and store is kept, any other stopped and started again; a
    cpu-pool worker started for another cluster is stopped, so that `up` starts it again."""
    previous, remote = state.spark, state.spark.remote if state.spark else None
    old = {k: r for k, r in state.processes.items() if k.startswith("spark-")}
    if (
        spec.workers
        and previous
        and previous.workers == spec.workers
        and previous.store_env == _store_env(env)
        and spark_cluster.cluster_alive(old, spec.workers)
    ):
        lines.append(f"Spark cluster already running (master {previous.master_url})")
        return
    lines += spark_cluster.stop_cluster({k: r for k, r in old.items() if is_alive(r)})
    for key in old:
        del state.processes[key]
    state.spark = None
    if spec.workers:
        endpoints = spark_cluster.start_cluster(launch, stack_dir, spec, env)
        state.spark = endpoints.model_copy(update={"store_env": _store_env(env)})
        lines.append(
            f"started Spark cluster: master {endpoints.master_url} (UI {endpoints.master_ui}), "
            f"{spec.workers} worker(s) x {spec.worker_cores} core(s) / {spec.worker_memory}, "
            f"Spark Connect {endpoints.remote}"
        )
    worker = state.processes.get(f"worker-{spark_cluster.SPARK_POOL}")
    if worker and remote != (state.spark.remote if state.spark else None):
        lines.append(
            f"{worker.name} (pid {worker.pid}): {stop(worker, grace_s=10, terms=2)} (Spark)"
        )
        del state.processes[worker.name]


def _store_env(env: dict[str, str]) -> str | None:
    """What the executors were given to reach the store (the S3 endpoint; no credentials)."""
    return env.get("AWS_ENDPOINT_URL")


def spark_summary(endpoints: SparkEndpoints | None) -> str:
    """One line on where the cpu-pool's Spark stages run."""
    if endpoints is None:
        return "local[*] inside the cpu-pool worker's flow runs (no cluster)"
    return f"{endpoints.master_url} (UI {endpoints.master_ui}), Connect {endpoints.remote}"


def status_lines(database: DatabaseInfo | None, spark: SparkEndpoints | None) -> list[str]:
    """What `hybridflow status` says about the database and the Spark cluster."""
    lines = [f"database {database.describe() if database else '(not recorded)'}"]
    if spark is None:
        return [*lines, "Spark local[*] in the cpu-pool worker's flow runs (no cluster)"]
    return lines + spark_cluster.status_lines(spark)


def stop_order(key: str) -> tuple[int, str]:
    """How `down` orders a stack's processes: the Prefect workers, the server, the Spark cluster
    (driver first, master last), S3, and the database last (the server uses it until it stops)."""
    if key.startswith("worker"):
        return 0, key
    if key == "server":
        return 1, key
    if key.startswith("spark-"):
        return 2, f"{spark_cluster.stop_rank(key)}{key}"
    return (4 if key == postgres.KEY else 3), key
