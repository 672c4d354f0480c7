"""`hybridflow up / down / status`: a local Prefect stack on 127.0.0.1 from the project's files.

State lives in ``settings.stack_dir`` (``stack.json``: URLs, ports and the PIDs this stack started;
``logs/``; ``prefect/`` as the server's PREFECT_HOME; ``postgres/`` the server's PostgreSQL data
and password file; ``spark/`` the Spark workers' folders). ``up`` is idempotent: what runs is
kept, what died is restarted, pools and deployments are upserted. The database and the Spark
cluster are :mod:`infra.stack.engines`.
Every process is written to the state file the moment it is launched (before anything else can
fail), and a process that does not become ready is stopped and dropped from it, so ``down``
always finds everything ``up`` left running. Deployment schedules are deployed paused unless
``--schedules`` is given: a stack (a test stack above all) does not fire on the wall clock.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from infra.errors import HybridflowInputError
from infra.routing.pools import POOLS
from infra.settings import HybridflowSettings, StackDatabase
from infra.stack import engines, prefect_admin, services
from infra.stack.engines import DatabaseInfo
from infra.stack.processes import Launcher, ProcessRecord, Ready, is_alive, launch, stop
from infra.stack.spark_cluster import SPARK_POOL, SparkClusterSpec, SparkEndpoints

log = logging.getLogger(__name__)

STATE_FILE = "stack.json"
S3_BUCKET = "hybridflow"
SERVER_READY_TIMEOUT_S = 180.0
S3_READY_TIMEOUT_S = 60.0
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
    schedules: bool = False
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
    return _store_access_env(env, state)


def _store_access_env(base: dict[str, str], state: StackState) -> dict[str, str]:
    """The stack's S3 endpoint and (when the environment has none) moto's dummy credentials."""
    env = dict(base)
    if state.s3_endpoint:
        env["AWS_ENDPOINT_URL"] = state.s3_endpoint
        env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        for key, value in LOCAL_S3_CREDENTIALS.items():
            env.setdefault(key, value)
    return env


def _launch_recorded(
    settings: HybridflowSettings,
    state: StackState,
    key: str,
    command: list[str],
    env: dict[str, str],
    ready: Ready = lambda record: None,
    user: str | None = None,
) -> ProcessRecord:
    """Launch a process and record it in the state file at once, then wait for ``ready``; one
    that does not become ready is stopped and its record dropped again."""
    log_file = settings.stack_dir.expanduser().resolve() / "logs" / f"{key}.log"
    record = launch(key, command, env, log_file, Path(state.project_dir), user=user)
    state.processes[key] = record
    _save_state(settings, state)
    try:
        ready(record)
    except BaseException:
        stop(record, grace_s=5)
        state.processes.pop(key, None)
        _save_state(settings, state)
        raise
    return record


def _server_ready(port: int) -> Callable[[ProcessRecord], None]:
    def ready(record: ProcessRecord) -> None:
        url = f"http://127.0.0.1:{port}/api/health"
        log_file = Path(record.log_file)
        services.wait_http_ok(url, SERVER_READY_TIMEOUT_S, "Prefect server", log_file)

    return ready


def _s3_ready(endpoint: str) -> Callable[[ProcessRecord], None]:
    def ready(record: ProcessRecord) -> None:
        import boto3

        log_file = Path(record.log_file)
        services.wait_http_ok(endpoint + "/", S3_READY_TIMEOUT_S, "S3 server (moto)", log_file)
        creds = {k.lower(): os.environ.get(k, v) for k, v in LOCAL_S3_CREDENTIALS.items()}
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **creds)
        client.create_bucket(Bucket=S3_BUCKET)

    return ready


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
                for pool in POOLS
                if any(w.status == "ONLINE" for w in client.read_workers_for_work_pool(pool))
            ]
            if len(online) == len(POOLS):
                return
            time.sleep(0.5)
    raise RuntimeError(f"workers did not come online within {timeout_s:.0f}s (see logs/)")


def _recording_launcher(settings: HybridflowSettings, state: StackState) -> Launcher:
    """A :class:`Launcher` for the engines that records into this stack's state file."""

    def start(
        key: str, command: list[str], env: dict[str, str], ready: Ready, user: str | None = None
    ) -> ProcessRecord:
        return _launch_recorded(settings, state, key, command, env, ready, user)

    return start


def _ensure_server(
    settings: HybridflowSettings,
    state: StackState,
    port: int,
    lines: list[str],
    db_env: dict[str, str] | None = None,
) -> None:
    server = state.processes.get("server")
    if server and is_alive(server):
        lines.append(f"Prefect server already running (pid {server.pid})")
        return
    services.check_port_free(port, "the Prefect server")
    state.api_url = f"http://127.0.0.1:{port}/api"
    state.ui_url = state.api_url.removesuffix("/api")
    env = _prefect_env(settings.stack_dir.expanduser().resolve(), state.api_url) | (db_env or {})
    command = services.server_command(port)
    server = _launch_recorded(settings, state, "server", command, env, _server_ready(port))
    lines.append(f"started Prefect server (pid {server.pid})")


def _ensure_s3(
    settings: HybridflowSettings, state: StackState, wanted: bool, env: dict, lines: list
) -> None:
    s3 = state.processes.get("s3")
    if state.s3_endpoint and s3 and is_alive(s3):
        lines.append(f"S3 server already running (pid {s3.pid}) at {state.s3_endpoint}")
        return
    state.processes.pop("s3", None)
    state.s3_endpoint = None
    if not wanted:
        return
    port = services.free_port()
    endpoint = f"http://127.0.0.1:{port}"
    command = services.s3_command(port)
    s3 = _launch_recorded(settings, state, "s3", command, env, _s3_ready(endpoint))
    state.s3_endpoint = endpoint
    _save_state(settings, state)
    lines.append(f"started S3 server (moto, pid {s3.pid}) at {endpoint}")


def _ensure_workers(
    settings: HybridflowSettings, state: StackState, base: dict, lines: list[str]
) -> None:
    for pool in POOLS:
        key = f"worker-{pool}"
        worker = state.processes.get(key)
        if worker and is_alive(worker):
            lines.append(f"{pool} worker already running (pid {worker.pid})")
            continue
        env = _worker_env(base, state, pool, settings.stack_heartbeat_seconds)
        worker = _launch_recorded(settings, state, key, services.worker_command(pool), env)
        lines.append(f"started {pool} worker (pid {worker.pid})")


def _ensure_events_watcher(
    settings: HybridflowSettings, state: StackState, base: dict, lines: list[str]
) -> None:
    """``hybridflow events watch`` on the stack's store: the endpoints' new segments become
    ``hybridflow.events.landed``, which model-refresh's new-data trigger listens for; with the
    stack's own demo events, the segments are exported into that folder first, so the
    deployments' runs read them too (a folder of yours is left alone). Recorded as a worker,
    so ``down`` stops it first and a change of store replaces it."""
    key = "worker-events-watch"
    watcher = state.processes.get(key)
    if watcher and is_alive(watcher):
        lines.append(f"events watcher already running (pid {watcher.pid})")
        return
    events = Path(state.events) if state.events else None
    into = events if events is not None and events == demo_events_dir(settings) else None
    env = _store_access_env(dict(base) | {"HYBRIDFLOW_STORE": state.store}, state)
    watcher = _launch_recorded(settings, state, key, services.events_watch_command(into), env)
    lines.append(f"started the events log's watcher (pid {watcher.pid})")


def _retire_workers_of_another_store(
    settings: HybridflowSettings, state: StackState, store: str, lines: list[str]
) -> None:
    """Workers started for a different store are stopped (they would write to the old one)."""
    if state.store == store:
        return
    for key in [k for k in state.processes if k.startswith("worker-")]:
        record = state.processes[key]
        if is_alive(record):
            outcome = stop(record, grace_s=10, terms=2)
            lines.append(f"{key} (pid {record.pid}): {outcome} (store changed)")
        del state.processes[key]
        _save_state(settings, state)
    state.store = store


def up(settings: HybridflowSettings, options: UpOptions) -> list[str]:
    """Start (or complete) the stack; returns the lines to print."""
    stack_dir = settings.stack_dir.expanduser().resolve()
    project = project_dir()
    events = options.events.expanduser().resolve()
    if not events.exists():
        raise HybridflowInputError(f"events {events}: no such file or folder")
    lines: list[str] = []
    state = load_state(settings) or StackState(
        api_url="", ui_url="", project_dir=str(project), events=str(events), store=""
    )
    state.project_dir, state.events = str(project), str(events)
    launch_recorded = _recording_launcher(settings, state)
    db_env = engines.ensure_database(launch_recorded, stack_dir, options.db, state, lines)
    _ensure_server(settings, state, options.port, lines, db_env)
    base = _prefect_env(stack_dir, state.api_url)
    _ensure_s3(settings, state, options.s3, base, lines)
    if state.s3_endpoint:
        store = f"s3://{S3_BUCKET}/store"
    else:
        from infra.storage.store import open_store

        store = open_store(settings.store).uri
    _retire_workers_of_another_store(settings, state, store, lines)
    executors_env = _store_access_env(base, state)
    engines.ensure_spark(launch_recorded, stack_dir, options.spark, state, executors_env, lines)
    _save_state(settings, state)

    api_url = state.api_url
    lines += prefect_admin.ensure_work_pools(api_url, settings.stack_gpu_slots)
    _ensure_workers(settings, state, base, lines)
    _ensure_events_watcher(settings, state, base, lines)
    lines.append(
        prefect_admin.ensure_zombie_automation(api_url, settings.stack_crash_after_seconds)
    )
    if options.deploy:
        lines += _deploy(
            stack_dir, project, events, base, options.schedules, settings.refresh.safety_net_hours
        )
    _wait_workers_online(api_url)
    return lines + [
        "",
        f"Prefect UI : {state.ui_url}",
        f"database   : {state.database.describe() if state.database else '-'}",
        f"Spark      : {engines.spark_summary(state.spark)}",
        f"store      : {state.store}",
        f"events     : {events}",
        "trigger the pipeline (default parameters) with:",
        f"  PREFECT_API_URL={api_url} prefect deployment run pipeline/pipeline",
        "stop everything with: hybridflow down",
    ]


def _deploy(
    stack_dir: Path,
    project: Path,
    events: Path,
    base: dict[str, str],
    schedules: bool,
    safety_net_hours: float | None,
) -> list[str]:
    """Deploy prefect.yaml (schedules paused unless ``schedules``), report the refresh triggers
    its deployment triggers created, and apply the refresh safety-net setting."""
    deploy_env = base | {
        "HYBRIDFLOW_PROJECT_DIR": str(project),
        "HYBRIDFLOW_DEPLOY_EVENTS": str(events),
    }
    prefect_admin.deploy_all(
        project, deploy_env, stack_dir / "logs" / "deploy.log", schedules_active=schedules
    )
    api_url = base["PREFECT_API_URL"]
    names = prefect_admin.deployment_names(api_url)
    when = "active" if schedules else "paused (hybridflow up --schedules to run them)"
    triggers = "; ".join(prefect_admin.refresh_triggers(api_url))
    return [
        f"deployed {len(names)}: {', '.join(names)}",
        f"schedules {when}",
        f"refresh triggers: {triggers}",
        prefect_admin.ensure_refresh_schedule(api_url, safety_net_hours, active=schedules),
    ]


def down(settings: HybridflowSettings) -> list[str]:
    """Stop exactly the processes `up` recorded: workers first, then the server, the Spark
    cluster, S3, the database last."""
    state = load_state(settings)
    if state is None:
        return ["no stack recorded: nothing to stop"]
    lines = []
    order = sorted(state.processes, key=engines.stop_order)
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
