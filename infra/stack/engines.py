"""`hybridflow up`'s production engines: the Prefect server's database and the Spark cluster.

Each ``ensure_*`` keeps what still runs and starts what is missing, returning the processes to
record in the stack state (the same :class:`ProcessRecord` records as the server and workers,
so ``down`` stops them by PID) and a line per action for the user.
"""

from __future__ import annotations

import os
from pathlib import Path

from infra.settings import StackDatabase
from infra.stack import postgres, spark_cluster
from infra.stack.postgres import DatabaseInfo
from infra.stack.processes import ProcessRecord, is_alive, stop
from infra.stack.spark_cluster import SparkClusterSpec, SparkEndpoints


def sqlite_info(stack_dir: Path) -> DatabaseInfo:
    """The Prefect server's default SQLite database under the stack's PREFECT_HOME."""
    return DatabaseInfo(kind="sqlite", location=str(stack_dir / "prefect" / "prefect.db"))


def ensure_database(
    stack_dir: Path,
    kind: StackDatabase,
    previous: DatabaseInfo | None,
    processes: dict[str, ProcessRecord],
    cwd: Path,
    lines: list[str],
) -> tuple[DatabaseInfo, ProcessRecord | None, dict[str, str]]:
    """The database for the Prefect server (started before it): its description, its process
    (PostgreSQL) and the environment only the server's process gets (it holds the password).
    A running server on another database is stopped, so that `up` restarts it on this one."""
    info, record = _database(stack_dir, kind, previous, processes.get(postgres.KEY), cwd, lines)
    server = processes.get("server")
    if previous is not None and previous != info and server and is_alive(server):
        lines.append(f"server (pid {server.pid}): {stop(server, grace_s=10)} (database changed)")
    if info.kind != "postgres":
        return info, record, {}
    return (
        info,
        record,
        postgres.prefect_server_env(info, postgres.password(stack_dir / "postgres")),
    )


def _database(
    stack_dir: Path,
    kind: StackDatabase,
    previous: DatabaseInfo | None,
    running: ProcessRecord | None,
    cwd: Path,
    lines: list[str],
) -> tuple[DatabaseInfo, ProcessRecord | None]:
    if kind == "sqlite":
        return sqlite_info(stack_dir), None
    if previous and previous.kind == "postgres" and running and is_alive(running):
        lines.append(f"PostgreSQL already running (pid {running.pid})")
        return previous, running
    pg_dir = stack_dir / "postgres"
    reused = (pg_dir / "data" / "PG_VERSION").is_file()
    record, info = postgres.start(
        pg_dir,
        dict(os.environ),
        cwd,
        stack_dir / "logs" / "postgres.log",
        port=previous.port if previous else None,
    )
    lines.append(
        f"started PostgreSQL (pid {record.pid}) on 127.0.0.1:{info.port}, "
        + ("existing data" if reused else "new data folder")
    )
    return info, record


def ensure_spark(
    stack_dir: Path,
    spec: SparkClusterSpec,
    previous: SparkEndpoints | None,
    previous_records: dict[str, ProcessRecord],
    env: dict[str, str],
    cwd: Path,
    lines: list[str],
) -> tuple[SparkEndpoints | None, dict[str, ProcessRecord]]:
    """The Spark cluster (None with no workers wanted) and its processes; a cluster that is
    complete and of the wanted size is kept, a partial one is stopped and started again."""
    old = {k: r for k, r in previous_records.items() if k.startswith("spark-")}
    same_env = previous is not None and previous.store_env == _store_env(env)
    if (
        spec.workers
        and previous
        and previous.workers == spec.workers
        and same_env
        and spark_cluster.cluster_alive(old, spec.workers)
    ):
        lines.append(f"Spark cluster already running (master {previous.master_url})")
        return previous, old
    lines += spark_cluster.stop_cluster({k: r for k, r in old.items() if is_alive(r)})
    if not spec.workers:
        return None, {}
    endpoints, records = spark_cluster.start_cluster(stack_dir, spec, env, cwd)
    endpoints = endpoints.model_copy(update={"store_env": _store_env(env)})
    lines.append(
        f"started Spark cluster: master {endpoints.master_url} (UI {endpoints.master_ui}), "
        f"{spec.workers} worker(s) x {spec.worker_cores} core(s) / {spec.worker_memory}, "
        f"Spark Connect {endpoints.remote}"
    )
    return endpoints, records


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
