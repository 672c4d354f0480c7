"""`hybridflow up / down / status`: a local Prefect stack on 127.0.0.1 from the project's files.

State lives in ``settings.stack_dir`` (``stack.json``: URLs, ports and the PIDs this stack started;
``logs/``; ``prefect/`` as the server's PREFECT_HOME; ``postgres/`` the server's PostgreSQL data
and password file; ``spark/`` the Spark workers' folders). ``up`` is idempotent: what runs is kept,
what died is restarted, pools and deployments are upserted. The database and the Spark cluster
are :mod:`infra.stack.engines`.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from pydantic import BaseModel

from infra.errors import HybridflowInputError
from infra.settings import HybridflowSettings, StackDatabase
from infra.stack import engines, prefect_admin, services
from infra.stack.engines import DatabaseInfo
from infra.stack.processes import ProcessRecord, is_alive, launch, stop
from infra.stack.spark_cluster import SPARK_POOL, SparkClusterSpec, SparkEndpoints, stop_rank

log = logging.getLogger(__name__)

STATE_FILE = "stack.json"
S3_BUCKET = "hybridflow"
# moto accepts any credentials; these are only used when the environment has none
LOCAL_S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "hybridflow-local",
    "AWS_SECRET_ACCESS_KEY": "hybridflow-local",
}


class StackState(BaseModel):
    """What `up` started and where it listens (no credentials)."""

    api_url: str
    ui_url: str
    project_dir: str
    events: str
    store: str
    s3_endpoint: str | None = None
    processes: dict[str, ProcessRecord] = {}
    database: DatabaseInfo | None = None
    spark: SparkEndpoints | None = None


class UpOptions(BaseModel):
    """Options of `hybridflow up`."""

    events: Path
    port: int = 4200
    s3: bool = False
    deploy: bool = True
    db: StackDatabase = "postgres"
    spark: SparkClusterSpec = SparkClusterSpec()


def project_dir() -> Path:
    """The folder holding prefect.yaml and the flows (this checkout)."""
    for candidate in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (candidate / "prefect.yaml").is_file() and (candidate / "flows").is_dir():
            return candidate.resolve()
    raise HybridflowInputError(
        "prefect.yaml not found: run `hybridflow up` from the hybridflow project folder"
    )


def state_path(settings: HybridflowSettings) -> Path:
    """Where the stack's state file lives."""
    return settings.stack_dir.expanduser().resolve() / STATE_FILE


def load_state(settings: HybridflowSettings) -> StackState | None:
    """The recorded stack, if any."""
    path = state_path(settings)
    return StackState.model_validate_json(path.read_text()) if path.is_file() else None


def _save_state(settings: HybridflowSettings, state: StackState) -> None:
    path = state_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state.model_dump_json(indent=2))
    os.replace(tmp, path)


def _prefect_env(stack_dir: Path, api_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PREFECT_HOME=str(stack_dir / "prefect"),
        PREFECT_API_URL=api_url,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_LOGGING_LEVEL="WARNING",
        PREFECT_LOGGING_EXTRA_LOGGERS="tasks,infra,flows",
        SPARK_LOCAL_IP="127.0.0.1",
    )
    return env


def _worker_env(base: dict[str, str], state: StackState, pool: str, heartbeat_s: int) -> dict:
    env = dict(base)
    env.update(
        HYBRIDFLOW_STORE=state.store,
        HYBRIDFLOW_POOL=pool,
        HYBRIDFLOW_PROJECT_DIR=state.project_dir,
        PREFECT_WORKER_QUERY_SECONDS="1",
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY=str(heartbeat_s),
    )
    if state.spark and pool == SPARK_POOL:
        env["HYBRIDFLOW_SPARK_REMOTE"] = state.spark.remote
    if state.s3_endpoint:
        env["AWS_ENDPOINT_URL"] = state.s3_endpoint
        env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        for key, value in LOCAL_S3_CREDENTIALS.items():
            env.setdefault(key, value)
    return env


def _start_server(stack_dir: Path, port: int, env: dict[str, str], cwd: Path) -> ProcessRecord:
    services.check_port_free(port, "the Prefect server")
    record = launch(
        "server", services.server_command(port), env, stack_dir / "logs" / "server.log", cwd
    )
    try:
        services.wait_http_ok(
            f"http://127.0.0.1:{port}/api/health", 180, "Prefect server", Path(record.log_file)
        )
    except RuntimeError:
        stop(record, grace_s=5)
        raise
    return record


def _start_s3(stack_dir: Path, env: dict[str, str], cwd: Path) -> tuple[ProcessRecord, str]:
    import boto3

    port = services.free_port()
    record = launch("s3", services.s3_command(port), env, stack_dir / "logs" / "s3.log", cwd)
    endpoint = f"http://127.0.0.1:{port}"
    services.wait_http_ok(endpoint + "/", 60, "S3 server (moto)", Path(record.log_file))
    creds = {k.lower(): os.environ.get(k, v) for k, v in LOCAL_S3_CREDENTIALS.items()}
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **creds).create_bucket(
        Bucket=S3_BUCKET
    )
    return record, endpoint


def recorded_events(settings: HybridflowSettings) -> Path | None:
    """The events a previous `up` deployed with, while they still exist."""
    state = load_state(settings)
    return Path(state.events) if state and Path(state.events).exists() else None


def demo_events_dir(settings: HybridflowSettings) -> Path:
    """Where `up` puts generated demo events when no events are given."""
    return settings.stack_dir.expanduser().resolve() / "demo-events"


def _wait_workers_online(api_url: str, timeout_s: float = 90) -> None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    deadline = time.monotonic() + timeout_s
    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            online = [
                pool
                for pool in services.POOLS
                if any(w.status == "ONLINE" for w in client.read_workers_for_work_pool(pool))
            ]
            if len(online) == len(services.POOLS):
                return
            time.sleep(0.5)
    raise RuntimeError(f"workers did not come online within {timeout_s:.0f}s (see logs/)")


def _ensure_server(
    stack_dir: Path,
    previous: StackState | None,
    port: int,
    cwd: Path,
    lines: list[str],
    db_env: dict[str, str] | None = None,
) -> tuple[str, ProcessRecord]:
    server = previous.processes.get("server") if previous else None
    if previous and server and is_alive(server):
        lines.append(f"Prefect server already running (pid {server.pid})")
        return previous.api_url, server
    api_url = f"http://127.0.0.1:{port}/api"
    server_env = _prefect_env(stack_dir, api_url) | (db_env or {})
    server = _start_server(stack_dir, port, server_env, cwd)
    lines.append(f"started Prefect server (pid {server.pid})")
    return api_url, server


def _ensure_s3(
    stack_dir: Path, previous: StackState | None, wanted: bool, env: dict, cwd: Path, lines: list
) -> tuple[str | None, ProcessRecord | None]:
    s3 = previous.processes.get("s3") if previous else None
    if previous and previous.s3_endpoint and s3 and is_alive(s3):
        lines.append(f"S3 server already running (pid {s3.pid}) at {previous.s3_endpoint}")
        return previous.s3_endpoint, s3
    if not wanted:
        return None, None
    s3, endpoint = _start_s3(stack_dir, env, cwd)
    lines.append(f"started S3 server (moto, pid {s3.pid}) at {endpoint}")
    return endpoint, s3


def _ensure_workers(
    settings: HybridflowSettings, state: StackState, base: dict, lines: list[str]
) -> None:
    stack_dir = settings.stack_dir.expanduser().resolve()
    for pool in services.POOLS:
        key = f"worker-{pool}"
        worker = state.processes.get(key)
        if worker and is_alive(worker):
            lines.append(f"{pool} worker already running (pid {worker.pid})")
            continue
        env = _worker_env(base, state, pool, settings.stack_heartbeat_seconds)
        log_file = stack_dir / "logs" / f"{key}.log"
        state.processes[key] = launch(
            key, services.worker_command(pool), env, log_file, Path(state.project_dir)
        )
        _save_state(settings, state)
        lines.append(f"started {pool} worker (pid {state.processes[key].pid})")


def up(settings: HybridflowSettings, options: UpOptions) -> list[str]:
    """Start (or complete) the stack; returns the lines to print."""
    stack_dir = settings.stack_dir.expanduser().resolve()
    project = project_dir()
    events = options.events.expanduser().resolve()
    if not events.exists():
        raise HybridflowInputError(f"events {events}: no such file or folder")
    previous = load_state(settings)
    lines: list[str] = []

    database, db_process, db_env = engines.ensure_database(
        stack_dir,
        options.db,
        previous.database if previous else None,
        previous.processes if previous else {},
        project,
        lines,
    )
    api_url, server = _ensure_server(stack_dir, previous, options.port, project, lines, db_env)
    base = _prefect_env(stack_dir, api_url)
    state = StackState(
        api_url=api_url,
        ui_url=api_url.removesuffix("/api"),
        project_dir=str(project),
        events=str(events),
        store="",
        processes={"server": server} | ({"postgres": db_process} if db_process else {}),
        database=database,
    )
    _save_state(settings, state)
    state.s3_endpoint, s3 = _ensure_s3(stack_dir, previous, options.s3, base, project, lines)
    if s3:
        state.processes["s3"] = s3
        state.store = f"s3://{S3_BUCKET}/store"
    else:
        from infra.store import open_store

        state.store = open_store(settings.store).uri
    _ensure_spark(settings, state, previous, options.spark, base, lines)
    for key, record in (previous.processes if previous else {}).items():
        if not key.startswith("worker-"):
            continue
        if previous and previous.store != state.store and is_alive(record):
            lines.append(
                f"{key} (pid {record.pid}): {stop(record, grace_s=10, terms=2)} (store changed)"
            )
            continue
        if key == f"worker-{SPARK_POOL}" and _remote(previous) != _remote(state):
            lines.append(f"{key} (pid {record.pid}): {stop(record, grace_s=10, terms=2)} (Spark)")
            continue
        state.processes[key] = record
    _save_state(settings, state)

    lines += prefect_admin.ensure_work_pools(api_url, settings.stack_gpu_slots)
    _ensure_workers(settings, state, base, lines)
    lines.append(
        prefect_admin.ensure_zombie_automation(api_url, settings.stack_crash_after_seconds)
    )
    if options.deploy:
        deploy_env = base | {
            "HYBRIDFLOW_PROJECT_DIR": str(project),
            "HYBRIDFLOW_DEPLOY_EVENTS": str(events),
        }
        prefect_admin.deploy_all(project, deploy_env, stack_dir / "logs" / "deploy.log")
        names = prefect_admin.deployment_names(api_url)
        lines.append(f"deployed {len(names)}: {', '.join(names)}")
    _wait_workers_online(api_url)
    return lines + [
        "",
        f"Prefect UI : {state.ui_url}",
        f"database   : {database.describe()}",
        f"Spark      : {engines.spark_summary(state.spark)}",
        f"store      : {state.store}",
        f"events     : {events}",
        "trigger the pipeline (default parameters) with:",
        f"  PREFECT_API_URL={api_url} prefect deployment run pipeline/pipeline",
        "stop everything with: hybridflow down",
    ]


def down(settings: HybridflowSettings) -> list[str]:
    """Stop exactly the processes `up` recorded: workers first, then the server and S3."""
    state = load_state(settings)
    if state is None:
        return ["no stack recorded: nothing to stop"]
    lines = []
    order = sorted(state.processes, key=_stop_order)
    for key in order:
        record = state.processes[key]
        if key.startswith("worker"):
            outcome = stop(record, grace_s=10.0, terms=2)
        else:
            outcome = stop(record, grace_s=10.0)
        lines.append(f"{key} (pid {record.pid}): {outcome}")
    state_path(settings).unlink(missing_ok=True)
    return lines


def status(settings: HybridflowSettings) -> tuple[bool, list[str]]:
    """Whether every recorded process runs, and a line per process."""
    state = load_state(settings)
    if state is None:
        return False, ["no stack running (start one with: hybridflow up)"]
    lines = [f"Prefect UI {state.ui_url} | store {state.store} | events {state.events}"]
    lines += engines.status_lines(state.database, state.spark)
    healthy = True
    for key, record in state.processes.items():
        alive = is_alive(record)
        healthy &= alive
        lines.append(f"  {key:<16} pid {record.pid:<8} {'running' if alive else 'NOT RUNNING'}")
    return healthy, lines


def _ensure_spark(
    settings: HybridflowSettings,
    state: StackState,
    previous: StackState | None,
    spec: SparkClusterSpec,
    base: dict[str, str],
    lines: list[str],
) -> None:
    """The Spark cluster, recorded in ``state``; its executors get the store's environment."""
    executor_env = _worker_env(base, state, SPARK_POOL, settings.stack_heartbeat_seconds)
    state.spark, records = engines.ensure_spark(
        settings.stack_dir.expanduser().resolve(),
        spec,
        previous.spark if previous else None,
        previous.processes if previous else {},
        executor_env,
        Path(state.project_dir),
        lines,
    )
    state.processes.update(records)
    _save_state(settings, state)


def _remote(state: StackState | None) -> str | None:
    return state.spark.remote if state and state.spark else None


def _stop_order(key: str) -> tuple[int, str]:
    """Workers first, then the server, the Spark cluster (driver first), S3, the database."""
    if key.startswith("worker"):
        return 0, key
    if key == "server":
        return 1, key
    if key.startswith("spark-"):
        return 2, f"{stop_rank(key)}{key}"
    return (4 if key == "postgres" else 3), key
